"""A peer that missed an outer step the others took: the global state they reached, from their states.

Groups of an outer exchange are keyed by the outer state (global parameters and outer momentum) the
exchange starts from. A peer whose exchange failed while a quorum of the roster committed one (it
found no group in time, behind NAT, say) keeps the old outer state, so every later exchange of the
others is keyed by a state it does not hold: it never meets them again. Catching up with its
cohort's states cannot help a cohort that is one peer, and loading another cohort's whole state
would throw its own progress away.

What it needs is only the swarm's new outer state. Every peer serves it inside its served state (see
:func:`supernet.outer_state.served_layout`), under the state's digest. This module finds the peers
that committed the missed exchange on the outer board (a quorum of the roster holding one result),
fetches their newest committed states, and returns the outer state that two of them agree on (one,
if the quorum had one other peer): cohorts differ in their own parameters, never in the outer state
after a step. The caller moves its global state there and shifts its parameters by the same step
(:meth:`peer.outer_round.OuterStepper.adopt_global`), keeping its own progress, which goes out with
its next exchange.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence

import torch

from hivemind_adapter.p2p import Endpoint
from hivemind_adapter.paged_blobs import BlobUnavailable
from hivemind_adapter.state_archive import fetch_state
from peer.commit.boards import CommitBoard
from peer.commit.quorum import is_quorum, members_of, newest_committed_state
from supernet.outer_state import OuterState, outer_digest, split_served

logger = logging.getLogger("manta.peer")

FETCH_SECONDS = 30.0  # one holder's state, at most


def takers_of(outer_board: CommitBoard, attempt: int, roster: Collection[str], peer_id: str) -> list[str]:
    """The other peers that committed the outer exchange ``attempt``: those holding the result that a
    quorum of ``roster`` reports (none if no result has one: then nobody took a step, and an "ok"
    only says that a peer's own group finished, as two cohorts that missed each other both do)."""
    reports = outer_board.read(attempt)
    members = members_of(reports, roster)
    by_result: dict[str, set[str]] = {}
    for peer, report in reports.items():
        if report.ok and report.digest:
            by_result.setdefault(report.digest, set()).add(peer)
    for peers in by_result.values():
        if is_quorum(peers, members):
            return sorted(peers - {peer_id})
    return []


def missed_outer_state(
    outer_board: CommitBoard,
    round_board: CommitBoard,
    endpoint: Endpoint,
    task_id: str,
    attempt: int,
    roster: Collection[str],
    peer_id: str,
    own_outer_digest: str,
    served_template: Sequence[torch.Tensor],
    served_consensus: int,
    layout: tuple[int, int, int],
) -> OuterState | None:
    """The outer state the peers that committed outer exchange ``attempt`` (a quorum of ``roster``)
    hold now, or None while it cannot be told (nobody committed it, their states are not reported
    or not served yet, or they still serve the state from before that step: overlapped, they take
    it at the next period's end).
    ``layout``: (workers' consensus tensors, workers' tensors, parameters), for splitting a served
    state."""
    consensus, worker_count, params = layout
    takers = takers_of(outer_board, attempt, roster, peer_id)
    needed = min(2, len(takers))
    found: dict[str, list[OuterState]] = {}
    for holder in takers:
        reported = newest_committed_state(round_board, [holder], any_holder=True)
        if reported is None:
            continue
        try:
            got = fetch_state(
                endpoint, [holder], task_id, reported.digest, list(served_template), served_consensus,
                FETCH_SECONDS,
            )  # fmt: skip
        except BlobUnavailable as e:
            logger.debug(f"state {reported.digest[:12]} of {holder[:12]} could not be fetched: {e}")
            continue
        _worker, outer = split_served(got.tensors, consensus, worker_count, params)
        if outer is None:
            continue
        key = outer_digest(outer)
        if key == own_outer_digest:
            return None  # they have not taken that step yet either: look again later
        found.setdefault(key, []).append(outer)
        if len(found[key]) >= needed:
            return found[key][0]
    return None
