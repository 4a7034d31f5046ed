"""Serving the current training state to late joiners, and downloading it as one.

hivemind's averagers can stream their state to a peer that asks (``load_state_from_peers``); this one
never averages, it only shares. What it serves is what the agent published after the last committed
round: the state tensors (:mod:`supernet.state`) with the round they belong to and their digest.
hivemind checks nothing it downloads, so a newcomer recomputes the digest and accepts the state only
if it matches the metadata, and prefers the peers advertising the newest round.
"""

from __future__ import annotations

import hashlib
import threading

import torch
from hivemind.averaging import DecentralizedAverager

from protocol.logs import get_logger
from protocol.runtime import StateHandoffGrace
from supernet.state import digest

logger = get_logger(__name__)


def peer_tiebreak(peer_id: str) -> float:
    """A fixed number in [0, 0.5) per peer: orders peers that serve states of the same round."""
    return int(hashlib.sha256(peer_id.encode()).hexdigest()[:12], 16) / 16**12 / 2


class StateSharer(StateHandoffGrace, DecentralizedAverager):
    """Shares ``state`` (a list of CPU tensors in the task's fixed layout) under ``{run_id}_state``.

    The class name is part of the wire protocol (hivemind names RPC handlers after the class): the
    aggregator's ``aggregator.checkpoints.StateSharer`` has the same name so each can download from
    the other.
    """

    def __init__(
        self,
        state: list[torch.Tensor],
        dht,
        run_id: str,
        consensus: int,
        *,
        client_mode: bool = False,
        **kwargs,
    ):
        self.consensus = consensus  # leading tensors that are identical across peers (what the digest covers)
        self._meta_lock = threading.Lock()
        self._meta = {"round": -1, "digest": ""}
        super().__init__(
            state,
            dht,
            prefix=f"{run_id}_state",
            min_matchmaking_time=1.0,
            request_timeout=0.5,
            # hivemind uses this (not the caller's timeout) per streamed chunk of a state download.
            next_chunk_timeout=10.0,
            allow_state_sharing=not client_mode,
            client_mode=client_mode,
            start=True,
            **kwargs,
        )

    def publish(self, round_index: int, tensors: list[torch.Tensor], attempt: int) -> str:
        """Make ``tensors`` (the state after ``round_index``, reached in averaging attempt ``attempt``)
        what newcomers download; returns its digest."""
        with self.get_tensors() as shared:
            for dst, src in zip(shared, tensors):
                dst.copy_(src)
            state_digest = digest(list(shared)[: self.consensus])
        tiebreak = peer_tiebreak(self.peer_id.to_base58())
        with self._meta_lock:
            self._meta = {
                "round": int(round_index),
                "digest": state_digest,
                "tiebreak": tiebreak,
                "attempt": int(attempt),
            }
        # Downloaders try the highest priority first: the newest round, then one fixed peer among equals,
        # so peers that diverged all converge on the same state instead of swapping states at random.
        if self.allow_state_sharing:  # a client-mode peer serves nothing, so it advertises nothing
            self.state_sharing_priority = float(round_index) + tiebreak
        return state_digest

    def get_current_state(self):
        # Called in this (host) process by hivemind when a peer downloads; must be self-consistent.
        self._handed_off()
        with self.get_tensors() as shared, self._meta_lock:
            return dict(self._meta), [t.clone() for t in shared], self.tensor_infos

    def download(self, timeout: float = 60.0) -> tuple[int, float, int, list[torch.Tensor], str] | None:
        """The best verified state another peer serves: (round, tiebreak, attempt, tensors, digest), or None
        (also when no download finished within ``timeout`` s: the caller carries on with its own state)."""
        try:
            result = self.load_state_from_peers(wait=True, timeout=timeout)
        except TimeoutError:
            logger.warning(
                f"no peer's state arrived within {timeout:.0f} s; keeping this peer's state for now"
            )
            return None
        if result is None:
            return None
        meta, tensors = result
        if not isinstance(meta, dict) or meta.get("round", -1) < 0:
            logger.debug("a peer served its initial state (no round yet); nothing to catch up on")
            return None
        got = digest(list(tensors)[: self.consensus])
        if got != meta.get("digest"):
            logger.warning(
                f"downloaded state does not match its digest ({got[:12]} != {str(meta.get('digest'))[:12]})"
            )
            return None
        return (
            int(meta["round"]),
            float(meta.get("tiebreak", 0.0)),
            int(meta.get("attempt", 0)),
            list(tensors),
            got,
        )
