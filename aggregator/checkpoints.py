"""The aggregator's copies of the swarm's states: for audits, for checkpoints, for ``--resume``.

Nothing is polled. Each receipt a peer delivers names the state its round started from (the result
of the round before) and the group that held it; the keeper notes that. When a spot audit needs a
start state, or a checkpoint is due, the keeper asks those peers for that exact state by digest
(:mod:`hivemind_adapter.state_archive`) and keeps it only if it hashes to that digest. So no round is
missed because a poll came at the wrong moment, and no state crosses the network unless it is used.

Checkpoints are :mod:`supernet.checkpoint` files ``checkpoints/round-NNNNNNNN.pt`` (the newest ``keep``
are kept). The newest one is also *served* by digest (:class:`StateArchive`) and anchored (``on_serve``:
the aggregator signs it), so a newcomer that finds no quorum's state on the board loads the
aggregator's — which is how ``manta-aggregator start --resume`` continues a run.
"""

from __future__ import annotations

import logging
import re
import threading
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import torch

from hivemind_adapter.p2p import Endpoint
from hivemind_adapter.paged_blobs import BlobUnavailable
from hivemind_adapter.state_archive import StateArchive, fetch_state, fetch_state_head
from supernet.checkpoint import CheckpointError, load_checkpoint, read_checkpoint, save_checkpoint
from supernet.outer_state import OuterState, served_consensus, served_layout, split_served
from supernet.state import consensus_count, digest, init_optimizer_state, state_tensors
from supernet.workload import Workload

logger = logging.getLogger(__name__)

_NAME = re.compile(r"^round-(\d{8})\.pt$")
PARTIAL_FETCHES = 8  # failed fetches whose pages are kept for the next try
T = TypeVar("T")


def checkpoint_files(directory: Path) -> list[Path]:
    """The checkpoint files in ``directory``, oldest round first."""
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if _NAME.match(p.name))


def newest_checkpoint(directory: Path) -> Path | None:
    files = checkpoint_files(directory)
    return files[-1] if files else None


@dataclass
class KnownState:
    """A committed state the keeper has heard of: the round it ends and who held it."""

    round: int
    holders: list[str] = field(default_factory=list)  # peer ids, most recent first


class CheckpointKeeper:
    def __init__(
        self,
        dht,
        endpoint: Endpoint,
        task_id: str,
        workload: Workload,
        directory: Path,
        *,
        keep: int = 5,
        cache: int = 16,  # states: a checkpoint's, and the start states audits replay
        held: int = 64,  # states kept beyond ``cache`` while a queued audit replays from them
        outer_period: int | None = None,
    ):
        self.workload, self.directory, self.keep, self.task_id = workload, Path(directory), keep, task_id
        self.endpoint = endpoint
        net = workload.build()
        optimizer = workload.make_optimizer(net)
        init_optimizer_state(net, optimizer)
        worker_state = [t.detach().contiguous().clone() for t in state_tensors(net, optimizer)]
        self._worker_layout = (
            len(worker_state),
            consensus_count(net, optimizer),
            len(list(net.parameters())),
        )
        # sync = "outer": peers serve their state with the outer state in it (supernet.outer_state), and
        # so does this keeper; its checkpoints hold the global parameters, the swarm's model.
        # Its global parameters change only at a period's end: only the states after one are written
        # (each fetch is a whole served state over the wide-area link).
        self.outer_period = outer_period
        initial_outer = (
            OuterState.starting_at(worker_state[: self._worker_layout[2]])
            if outer_period is not None
            else None
        )
        self.template = served_layout(worker_state, self._worker_layout[1], initial_outer)
        self.consensus = served_consensus(self._worker_layout[1], initial_outer)
        self._lock = threading.Lock()  # guards _known and _cache, never a transfer
        self._writing = threading.Lock()  # one checkpoint written at a time
        self._known: dict[str, KnownState] = {}
        # digest -> peers that said they hold it (a queued receipt's sender): where an audit fetches a
        # start state. Not a committed state until a receipt naming it is accepted (learn).
        self._holders: OrderedDict[str, list[str]] = OrderedDict()
        # Told (round, attempt, digest) of every state this keeper serves: the operator signs it as
        # the state peers may load without a quorum's word (protocol.records.StateAnchor).
        self.on_serve: Callable[[int, int, str], None] = lambda round_index, attempt, state_digest: None
        self._cache: OrderedDict[str, tuple[int, int, list[torch.Tensor]]] = OrderedDict()
        self._heads: OrderedDict[str, list[torch.Tensor]] = OrderedDict()  # digest -> its parameters
        self._cache_size, self._held_limit = cache, held
        self._held: Counter[str] = Counter()  # digest -> queued audits that replay from it
        # digest -> pages of a fetch that failed (a congested link): the next try asks only the rest
        self._partial: OrderedDict[str, dict[int, bytes]] = OrderedDict()
        self._fetching: dict[str, threading.Lock] = {}  # digest -> held while one thread fetches it
        self._remember(digest(self.template[: self.consensus]), -1, 0, self.template)  # the initial state
        self._written_round = -1
        # Set when an outer task's state after a period's end becomes known: it is learned only when
        # the next round's receipts close, and its holders serve it for a short while after; waiting
        # for the checkpoint loop's next tick could miss it when the run ends first.
        self.period_end_learned = threading.Event()
        self.fetched_bytes = 0
        self._closed = False
        self.archive = StateArchive(endpoint, task_id, head=self._worker_layout[2], keep=2)

    # ------------------------------------------------------------------ what exists where

    def learn(self, round_index: int, state_digest: str, holders: list[str]) -> None:
        """The swarm committed ``state_digest`` as the result of ``round_index``; ``holders`` had it."""
        with self._lock:
            known = self._known.setdefault(state_digest, KnownState(round_index))
            known.holders = list(dict.fromkeys([*holders, *known.holders]))[:16]
            while len(self._known) > 64:
                self._known.pop(next(iter(self._known)))
        period_end = self.outer_period is not None and (round_index + 1) % self.outer_period == 0
        if period_end and round_index > self._written_round:
            self.period_end_learned.set()

    def note_holders(self, state_digest: str, holders: list[str]) -> None:
        """``holders`` say they hold ``state_digest`` (unconfirmed: only a fetch checks it)."""
        with self._lock:
            known = self._holders.pop(state_digest, [])
            self._holders[state_digest] = list(dict.fromkeys([*holders, *known]))[:16]
            while len(self._holders) > 64:
                self._holders.popitem(last=False)

    def newest_known(self) -> tuple[str, KnownState] | None:
        """The newest state known to be committed (outer tasks: after a period's end)."""
        with self._lock:
            known = [
                item
                for item in self._known.items()
                if self.outer_period is None or (item[1].round + 1) % self.outer_period == 0
            ]
            return max(known, key=lambda item: item[1].round) if known else None

    # ------------------------------------------------------------------ getting states

    def _remember(
        self, state_digest: str, round_index: int, attempt: int, tensors: list[torch.Tensor]
    ) -> None:
        with self._lock:
            self._cache[state_digest] = (round_index, attempt, [t.clone() for t in tensors])
            self._evict(self._cache, state_digest)

    def _evict(self, store: OrderedDict, newest: str) -> None:
        """(Under the lock.) ``newest`` was just stored: at most ``cache`` entries no queued audit
        needs are kept (the oldest go first), and held ones only up to their own bound."""
        store.move_to_end(newest)
        unheld = [d for d in store if d not in self._held]
        for old in unheld[: max(0, len(unheld) - self._cache_size)]:
            del store[old]
        while len(store) > self._cache_size + self._held_limit:
            store.popitem(last=False)

    def hold(self, state_digest: str) -> None:
        """An audit that replays from ``state_digest`` is queued: keep the state once fetched."""
        with self._lock:
            self._held[state_digest] += 1

    def release(self, state_digest: str) -> None:
        """That audit is done."""
        with self._lock:
            self._held[state_digest] -= 1
            if self._held[state_digest] <= 0:
                del self._held[state_digest]

    def state_for(self, state_digest: str, timeout: float = 30.0) -> list[torch.Tensor] | None:
        """The state with this digest: from the cache, else from a peer that held it (checked against
        the digest). None if no holder is known or none could serve it within ``timeout`` s."""
        got = self._get(state_digest, timeout)
        return None if got is None else [t.clone() for t in self._worker_state(got[2])]

    def start_state(self, state_digest: str, timeout: float = 30.0) -> list[torch.Tensor] | None:
        """What an audit replays from: the workers' parameters of the state with this digest, and the
        rest of the workers' layout at its initial values (a replay reads no optimizer state, and
        batch-norm in training mode no running statistics). From the cache when the whole state or
        its parameters are here, else only the parameters are fetched (checked against the digest
        through the state's index). None if no holder could serve them within ``timeout`` s."""
        params = self._worker_layout[2]
        rest = self._worker_state(self.template)[params:]
        head = self._head(state_digest, timeout)
        return None if head is None else [t.clone() for t in [*head, *rest]]

    def _head(self, state_digest: str, timeout: float) -> list[torch.Tensor] | None:
        params = self._worker_layout[2]
        with self._lock:
            cached = self._cache.get(state_digest)
            head = self._heads.get(state_digest)
            holders = self._holders_of(state_digest)
        if cached is not None:
            return cached[2][:params]
        if head is not None or not holders:
            return head

        def fetch(partial: dict[int, bytes]) -> list[torch.Tensor]:
            got = fetch_state_head(
                self.endpoint, holders, self.task_id, state_digest, self.template[:params], self.consensus,
                timeout, partial,
            )  # fmt: skip
            self.fetched_bytes += sum(t.numel() * t.element_size() for t in got.tensors)
            with self._lock:
                self._heads[state_digest] = got.tensors
                self._evict(self._heads, state_digest)
            return got.tensors

        try:
            return self._fetch_once(
                f"{state_digest}/head", lambda: self._heads.get(state_digest), fetch, timeout
            )
        except BlobUnavailable as e:
            logger.info(f"the parameters of state {state_digest[:12]} could not be fetched: {e}")
            return None

    def _fetch_once(
        self, key: str, cached: Callable[[], T | None], fetch: Callable[[dict], T], timeout: float
    ) -> T | None:
        """``fetch(pages kept from a failed try)`` of ``key``, one thread at a time: a second waiter
        takes the first one's result, ``cached()`` (read under the lock). None if the wait for the
        other fetch outlasted ``timeout``; a failed fetch raises BlobUnavailable, its pages kept."""
        with self._lock:
            fetching = self._fetching.setdefault(key, threading.Lock())
        if not fetching.acquire(timeout=timeout):
            return None
        try:
            with self._lock:
                got = cached()
                partial = self._partial.pop(key, {}) if got is None else {}
            if got is not None:
                return got
            try:
                return fetch(partial)
            except BlobUnavailable:
                with self._lock:
                    if partial:
                        self._partial[key] = partial
                    while len(self._partial) > PARTIAL_FETCHES:
                        self._partial.popitem(last=False)
                raise
        finally:
            fetching.release()
            with self._lock:
                if key in self._fetching and not fetching.locked():
                    del self._fetching[key]

    def _holders_of(self, state_digest: str) -> list[str]:
        """(Under the lock.) Who said they hold ``state_digest``: committers first."""
        known = self._known.get(state_digest)
        return list(dict.fromkeys([*(known.holders if known else []), *self._holders.get(state_digest, [])]))

    def _worker_state(self, served: list[torch.Tensor], global_params: bool = False) -> list[torch.Tensor]:
        """A served state in the workers' layout: as it is (``every-step``), or without its outer state;
        ``global_params``: with the global parameters (the swarm's model) as its parameters."""
        count, consensus, params = self._worker_layout
        worker, outer = split_served(served, consensus, count, params)
        if outer is not None and global_params:
            worker = [*outer.global_params, *worker[params:]]
        return worker

    def _get(self, state_digest: str, timeout: float) -> tuple[int, int, list[torch.Tensor]] | None:
        with self._lock:
            cached = self._cache.get(state_digest)
            known = self._known.get(state_digest)
            holders = self._holders_of(state_digest)
        if cached is not None:
            return cached
        if not holders:
            return None

        def fetch(partial: dict[int, bytes]) -> tuple[int, int, list[torch.Tensor]]:
            state = fetch_state(
                self.endpoint, holders, self.task_id, state_digest, self.template, self.consensus, timeout,
                partial,
            )  # fmt: skip
            self.fetched_bytes += sum(t.numel() * t.element_size() for t in state.tensors)
            round_index = known.round if known else state.round
            self._remember(state_digest, round_index, state.attempt, state.tensors)  # before a waiter looks
            return round_index, state.attempt, state.tensors

        # the prefetch, an audit and the checkpoint loop may all want it: one fetch
        try:
            return self._fetch_once(state_digest, lambda: self._cache.get(state_digest), fetch, timeout)
        except BlobUnavailable as e:
            logger.info(f"state {state_digest[:12]} could not be fetched: {e}")
            return None

    # ------------------------------------------------------------------ checkpoints

    def write_checkpoint(self, timeout: float = 30.0) -> Path | None:
        """Write the newest committed state as a checkpoint (if newer than the last one written) and
        serve it; returns the file, or None if there was nothing new or it could not be fetched."""
        return self._write(timeout, serve=True)[0]

    def final_checkpoint(self, timeout: float = 30.0) -> str:
        """Write the newest committed state as a checkpoint, not served (the aggregator is stopping),
        waiting at most ``timeout`` s for it; returns one line saying what was written, or why not."""
        return self._write(timeout, serve=False)[1]

    def _write(self, timeout: float, serve: bool) -> tuple[Path | None, str]:
        with self._writing:  # the checkpoint loop's last tick and the final checkpoint, one at a time
            newest = self.newest_known()
            if newest is None:
                return None, "none written: no committed state was heard of"
            state_digest, known = newest
            if known.round <= self._written_round:
                return None, (
                    f"none needed: the newest committed state heard of, round {known.round}, is "
                    f"checkpointed (round {self._written_round})"
                )
            got = self._get(state_digest, timeout)
            if got is None:
                newest = f"round {self._written_round}" if self._written_round >= 0 else "none"
                return None, (
                    f"none written: the state of round {known.round} could not be had from its holders "
                    f"within {timeout:g} s (newest checkpoint: {newest})"
                )
            round_index, attempt, tensors = got
            path = save_checkpoint(
                self.directory / f"round-{round_index:08d}.pt",
                self.workload,
                self._worker_state(tensors, global_params=True),
                round_index,
                meta={"task_id": self.task_id, "attempt": attempt},
            )
            self._written_round = round_index
            for old in checkpoint_files(self.directory)[: -self.keep]:
                old.unlink(missing_ok=True)
            if serve:
                self.archive.add(round_index, attempt, state_digest, tensors, self.consensus)
                self.on_serve(round_index, attempt, state_digest)
                logger.info(f"checkpoint of round {round_index} written to {path}")
            return path, f"round {round_index} written to {path}"

    def resume(self, path: Path | None = None) -> int:
        """Serve the newest checkpoint (or ``path``); returns its round. CheckpointError if unusable."""
        path = path or newest_checkpoint(self.directory)
        if path is None:
            raise CheckpointError(f"no checkpoint to resume from in {self.directory}")
        loaded = load_checkpoint(path, task=self.workload.task)
        task_id = loaded.meta.get("task_id")
        if task_id != self.task_id:
            raise CheckpointError(f"{path} belongs to task {task_id!r}, not {self.task_id!r}")
        tensors = [t.detach().contiguous() for t in state_tensors(loaded.net, loaded.optimizer)]
        if len(self.template) != len(tensors):  # an outer task: its outer state starts at the checkpoint
            count, consensus, params = self._worker_layout
            tensors = served_layout(tensors, consensus, OuterState.starting_at(tensors[:params]))
        attempt = int(loaded.meta.get("attempt", 0))
        state_digest = digest(tensors[: self.consensus])
        self.archive.add(loaded.round, attempt, state_digest, tensors, self.consensus)
        self._remember(state_digest, loaded.round, attempt, tensors)
        self.on_serve(loaded.round, attempt, state_digest)
        self._written_round = loaded.round
        logger.info(f"resuming task {self.task_id} from {path.name} (round {loaded.round})")
        return loaded.round

    def newest_round(self) -> int:
        path = newest_checkpoint(self.directory)
        return -1 if path is None else int(read_checkpoint(path)["round"])

    def stop_serving(self) -> None:
        """Serve no state any more (idempotent)."""
        if not self._closed:
            self._closed = True
            self.archive.close()

    def shutdown(self) -> None:
        self.stop_serving()
