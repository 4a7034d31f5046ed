"""Catching up with the swarm: the newest state a quorum committed, from every peer that holds it.

A peer that joins, or whose round failed, needs the state the others hold now. The commit board says
which state a majority of the roster holds after the last committed result, and who; every peer keeps
its recent committed states by digest (:mod:`hivemind_adapter.state_archive`). So the peer asks all
of those holders at once, a page each (:func:`hivemind_adapter.paged_blobs.fetch_spread`): on the
open internet a download is bounded by the server's uplink, and k holders serve it up to k times as
fast. What arrives must hash to the quorum's digest, not to a digest its server chose. When the board
knows no such state (the first peers of a run, or a run resumed from the aggregator's checkpoint
with no peer left), hivemind's state sharing is the fallback (:class:`StateSharer`).
"""

from __future__ import annotations

import logging
from collections.abc import Collection

import torch

from hivemind_adapter.p2p import Endpoint
from hivemind_adapter.paged_blobs import BlobUnavailable
from hivemind_adapter.state_archive import fetch_state
from hivemind_adapter.state_sharing import SharedState
from peer.round_commit import CommitBoard, CommittedState, newest_committed_state

logger = logging.getLogger("manta.peer")

QUORUM_TIEBREAK = 1.0  # a quorum's result wins a tie against any one server's (theirs are in (0, 0.5))
PAGE_TIMEOUT = 30.0  # seconds for one page from one holder


def committed_state(
    board: CommitBoard,
    roster: Collection[str],
    endpoint: Endpoint,
    task_id: str,
    template: list[torch.Tensor],
    consensus: int,
    own_digest: str,
) -> tuple[CommittedState | None, SharedState | None]:
    """``(newest, state)``: the newest state a quorum holds (None if the board knows none) and that
    state, fetched from its holders and checked against its digest (None if this peer already holds
    it, or no holder could serve it: the caller falls back to state sharing)."""
    result = newest_committed_state(board, roster)
    if result is None or result.digest == own_digest:
        return result, None
    try:
        got = fetch_state(endpoint, result.holders, task_id, result.digest, template, consensus, PAGE_TIMEOUT)
    except BlobUnavailable as e:
        logger.warning(f"the committed state {result.digest[:12]} could not be fetched from its holders: {e}")
        return result, None
    logger.debug(f"fetched state {result.digest[:12]} from {len(result.holders)} holder(s)")
    # The round number is its servers' word (the digest covers the tensors): they are a quorum's peers.
    return result, SharedState(got.round, got.digest, result.attempt, QUORUM_TIEBREAK, got.tensors)
