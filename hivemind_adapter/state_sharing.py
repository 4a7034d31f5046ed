"""Serving the current training state to late joiners, and downloading it as one.

hivemind's averagers can stream their state to a node that asks (``load_state_from_peers``); this one
never averages, it only shares. What it serves is the state its owner published: the state tensors
(:mod:`supernet.state`) with the round they belong to, their digest, the averaging attempt that made
them and a tie-break. hivemind checks nothing it downloads, so :meth:`StateSharer.download`
recomputes the digest and returns a state only if it matches.

Peers and the aggregator use this one class (hivemind names the RPC handlers after the class, so
both sides must anyway): peers publish each committed state with a tie-break in (0, 0.5) that orders
peers serving the same round; the aggregator publishes a checkpoint it resumes from with tie-break 0,
below every peer, so a newcomer prefers a live peer but finds the aggregator's when none is left.
"""

from __future__ import annotations

import hashlib
import logging
import math
import threading
import time
from dataclasses import dataclass

import torch
from hivemind.averaging import DecentralizedAverager

from hivemind_adapter.averager_process import BoundedAveragerProcess
from hivemind_adapter.p2p_sockets import RemovesItsSocket
from supernet.state import digest

logger = logging.getLogger(__name__)


def peer_tiebreak(peer_id: str) -> float:
    """A fixed number in [0, 0.5) per peer: orders peers that serve states of the same round."""
    return int(hashlib.sha256(peer_id.encode()).hexdigest()[:12], 16) / 16**12 / 2


@dataclass(frozen=True)
class SharedState:
    """A state as served and as downloaded (after its digest was checked)."""

    round: int  # the round it is the result of (-1: the initial state)
    digest: str
    attempt: int  # the averaging attempt that produced it
    tiebreak: float
    tensors: list[torch.Tensor]


class StateSharer(BoundedAveragerProcess, RemovesItsSocket, DecentralizedAverager):
    """Shares one state (CPU tensors in the task's fixed layout) under ``{run_id}_state``.

    Stopping cleanly: hivemind hands a served state to the averager's own process as tensors whose
    file descriptors that process then fetches from ours. Shutting down mid-fetch resets that
    connection and prints a traceback here, so :meth:`stop_serving` refuses new downloads and waits
    until :data:`HANDOFF_GRACE` seconds have passed since the last hand-off (a fetch takes ms).
    """

    HANDOFF_GRACE = 1.0

    def __init__(
        self, template: list[torch.Tensor], dht, run_id: str, consensus: int, *, client_mode: bool = False
    ):
        self.consensus = consensus  # leading tensors identical across peers (what the digest covers)
        self._meta_lock = threading.Lock()  # guards _meta, which must match the shared tensors
        self._meta = {"round": -1, "digest": "", "tiebreak": 0.0, "attempt": 0}
        self._last_handoff = float("-inf")
        self.downloads_served = 0  # states handed to downloading nodes (in this, the host process)
        # Offered to downloaders only from the first publish on: peers that start together all hold
        # the same initial state, and each one's start-up download would go to the others, which are
        # starting too, and wait out its timeout for a state equal to its own.
        self._may_serve = not client_mode
        super().__init__(
            [t.detach().cpu().contiguous().clone() for t in template],  # hivemind flattens with .view(-1)
            dht,
            prefix=f"{run_id}_state",
            min_matchmaking_time=1.0,
            request_timeout=0.5,
            # hivemind uses this (not the caller's timeout) per streamed chunk of a state download.
            next_chunk_timeout=10.0,
            allow_state_sharing=False,
            client_mode=client_mode,
            start=True,
        )

    @property
    def served(self) -> dict:
        with self._meta_lock:
            return dict(self._meta)

    def publish(self, round_index: int, tensors: list[torch.Tensor], attempt: int, tiebreak: float) -> str:
        """Serve ``tensors`` (the state after ``round_index``, made in averaging attempt ``attempt``);
        returns its digest. :class:`AveragerGone` if this sharer's process ended (it would serve nothing)."""
        self.check_alive()
        with self.get_tensors() as shared:
            for dst, src in zip(shared, tensors):
                dst.copy_(src)
            state_digest = digest(list(shared)[: self.consensus])
        with self._meta_lock:
            self._meta = {
                "round": int(round_index),
                "digest": state_digest,
                "tiebreak": tiebreak,
                "attempt": int(attempt),
            }
        # Downloaders try the highest priority first: the newest round, then one fixed server among
        # equals, so nodes that diverged converge on the same state instead of swapping states at random.
        if self._may_serve:  # a client-mode node serves nothing, so it advertises nothing
            self.state_sharing_priority = float(round_index) + tiebreak
            if not self.allow_state_sharing:
                self.allow_state_sharing = True  # declares it, with the priority just set
        return state_digest

    def get_current_state(self):
        # Called in this (host) process by hivemind when a node downloads; must be self-consistent.
        self._last_handoff = time.monotonic()
        self.downloads_served += 1
        with self.get_tensors() as shared, self._meta_lock:
            return dict(self._meta), [t.clone() for t in shared], self.tensor_infos

    def download(self, timeout: float = 60.0) -> SharedState | None:
        """The best verified state another node serves, or None (none served, its digest did not
        match, or nothing finished within ``timeout`` s: the caller carries on with its own state).
        :class:`AveragerGone` at once if this sharer's process ended (the wait would be in vain)."""
        self.check_alive()
        try:
            result = self.load_state_from_peers(wait=True, timeout=timeout)
        except TimeoutError:
            logger.warning(f"no state arrived within {timeout:.0f} s; keeping this node's state for now")
            return None
        if result is None:
            return None
        meta, tensors = result
        served = served_meta(meta)
        if served is None:
            logger.warning("a node served a state whose metadata is malformed; ignored")
            return None
        round_index, claimed, attempt, tiebreak = served
        if round_index < 0:
            logger.debug("a node served an initial state (no round yet); nothing to catch up on")
            return None
        tensors = list(tensors)
        with self.get_tensors() as own:
            shapes = [(t.shape, t.dtype) for t in own]
        if [(t.shape, t.dtype) for t in tensors] != shapes:
            logger.warning("a node served a state of other shapes; ignored")
            return None
        if not all(torch.isfinite(t).all() for t in tensors if t.is_floating_point()):
            logger.warning("a node served a state with non-finite values; ignored")
            return None
        got = digest(tensors[: self.consensus])
        if got != claimed:
            logger.warning(f"downloaded state does not match its digest ({got[:12]} != {claimed[:12]})")
            return None
        return SharedState(round_index, got, attempt, tiebreak, tensors)

    def stop_serving(self, grace: float | None = None) -> None:
        self._may_serve = False  # a publish after this must not offer the state again
        try:
            if self.allow_state_sharing:
                self.allow_state_sharing = False
        except OSError:  # the averager process is already gone: nothing in flight either
            return
        wait = self.HANDOFF_GRACE if grace is None else grace
        time.sleep(max(0.0, self._last_handoff + wait - time.monotonic()))


def served_meta(meta: object) -> tuple[int, str, int, float] | None:
    """(round, digest, attempt, tiebreak) of a served state's metadata, or None if any is malformed:
    nobody signs it, so a holder may send anything."""
    if not isinstance(meta, dict):
        return None
    round_index, claimed = meta.get("round", -1), meta.get("digest")
    attempt, tiebreak = meta.get("attempt", 0), meta.get("tiebreak", 0.0)
    if type(round_index) is not int or type(attempt) is not int or not isinstance(claimed, str):
        return None
    if type(tiebreak) not in (int, float) or not math.isfinite(tiebreak):
        return None
    return round_index, claimed, attempt, float(tiebreak)
