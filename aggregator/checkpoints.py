"""The aggregator's checkpoints: the run survives every volunteer leaving.

Peers serve their state (parameters, optimizer state, round) through hivemind's state sharing under
``{task}_state`` (see ``peer/state_sharing.py``). The aggregator joins the same averager key as one
more sharer: every ``interval`` seconds it downloads the newest state the peers serve, checks it
against the digest they advertise (hivemind checks nothing it downloads), and writes it as a
:mod:`supernet.checkpoint` file ``checkpoints/round-NNNNNNNN.pt`` (keeping the newest ``keep``).

It also *serves* its newest checkpoint, with the lowest priority among states of the same round, so
a newcomer prefers a live peer's state but finds the aggregator's when no peer is left — which is how
``manta-aggregator start --resume`` continues a run: it loads the newest checkpoint, serves it, and
the first peers to join download it and carry on from the round after it.
"""

from __future__ import annotations

import re
import threading
from pathlib import Path

import torch
from hivemind.averaging import DecentralizedAverager

from protocol.logs import get_logger
from protocol.runtime import StateHandoffGrace
from supernet.checkpoint import CheckpointError, load_checkpoint, read_checkpoint, save_checkpoint
from supernet.state import consensus_count, digest, init_optimizer_state, state_tensors
from supernet.workload import Workload

logger = get_logger(__name__)

_NAME = re.compile(r"^round-(\d{8})\.pt$")


def checkpoint_files(directory: Path) -> list[Path]:
    """The checkpoint files in ``directory``, oldest round first."""
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if _NAME.match(p.name))


def newest_checkpoint(directory: Path) -> Path | None:
    files = checkpoint_files(directory)
    return files[-1] if files else None


class StateSharer(StateHandoffGrace, DecentralizedAverager):
    """Downloads, writes and serves the task's training state (see the module docstring).

    The class name is part of the wire protocol: hivemind names its RPC handlers after the servicer
    class (``<prefix>::StateSharer.rpc_download_state``), so this class must be called exactly like the
    peers' ``peer.state_sharing.StateSharer`` for either side to download from the other.
    """

    def __init__(
        self, dht, task_id: str, workload: Workload, directory: Path, *, keep: int = 5, cache: int = 8
    ):
        self.workload, self.directory, self.keep = workload, Path(directory), keep
        self.task_id = task_id
        # Recent states by digest (what spot audits replay receipts from), the initial one included.
        self._cache: dict[str, list[torch.Tensor]] = {}
        self._cache_size = cache
        self._cache_changed = threading.Condition()
        self._written_round = -1
        net = workload.build()
        optimizer = workload.make_optimizer(net)
        init_optimizer_state(net, optimizer)
        self.consensus = consensus_count(net, optimizer)
        # contiguous (hivemind flattens with .view(-1)), as the peers' shared state is
        template = [t.detach().contiguous().clone() for t in state_tensors(net, optimizer)]
        self._remember(digest(template[: self.consensus]), template)
        self._meta_lock = threading.Lock()
        self.meta = {"round": -1, "digest": "", "tiebreak": 0.0, "attempt": 0}
        super().__init__(
            template,
            dht,
            prefix=f"{task_id}_state",
            min_matchmaking_time=1.0,
            request_timeout=0.5,
            next_chunk_timeout=10.0,
            allow_state_sharing=True,
            start=True,
        )
        self.state_sharing_priority = -1.0  # nothing worth serving until a state is loaded or downloaded

    # ------------------------------------------------------------------ serving

    def get_current_state(self):
        # Called by hivemind when a peer downloads; must be self-consistent.
        self._handed_off()
        with self.get_tensors() as shared, self._meta_lock:
            return dict(self.meta), [t.clone() for t in shared], self.tensor_infos

    def _adopt(self, tensors: list[torch.Tensor], meta: dict) -> None:
        with self.get_tensors() as shared:
            for dst, src in zip(shared, tensors):
                dst.copy_(src)
        with self._meta_lock:
            self.meta = {**meta, "tiebreak": 0.0}
        # Below every peer serving the same round (their tie-breaks are in (0, 0.5)).
        self.state_sharing_priority = float(meta["round"])

    def resume(self, path: Path | None = None) -> int:
        """Serve the newest checkpoint (or ``path``); returns its round. CheckpointError if unusable."""
        path = path or newest_checkpoint(self.directory)
        if path is None:
            raise CheckpointError(f"no checkpoint to resume from in {self.directory}")
        loaded = load_checkpoint(path, task=self.workload.task)
        task_id = loaded.meta.get("task_id")
        if task_id != self.task_id:
            raise CheckpointError(f"{path} belongs to task {task_id!r}, not {self.task_id!r}")
        tensors = state_tensors(loaded.net, loaded.optimizer)
        attempt = int(loaded.meta.get("attempt", 0))
        self._adopt(tensors, {"round": loaded.round, "digest": loaded.digest, "attempt": attempt})
        self._remember(loaded.digest, [t.detach().contiguous() for t in tensors])
        self._written_round = loaded.round
        logger.info(f"resuming task {self.task_id} from {path.name} (round {loaded.round})")
        return loaded.round

    # ------------------------------------------------------------------ downloading

    def download(self, timeout: float = 60.0) -> int | None:
        """Download the newest state the swarm serves if it is newer than ours; returns its round."""
        result = self.load_state_from_peers(wait=True, timeout=timeout)
        if result is None:
            return None
        meta, tensors = result
        if not isinstance(meta, dict) or int(meta.get("round", -1)) <= int(self.meta["round"]):
            return None
        tensors = list(tensors)
        got = digest(tensors[: self.consensus])
        if got != meta.get("digest"):
            logger.warning(f"a peer served a state that does not match its digest ({got[:12]}); not kept")
            return None
        round_index = int(meta["round"])
        self._adopt(tensors, {"round": round_index, "digest": got, "attempt": int(meta.get("attempt", 0))})
        self._remember(got, tensors)
        return round_index

    def write_checkpoint(self) -> Path | None:
        """Write the newest downloaded state as a checkpoint file (if not written yet)."""
        with self._meta_lock:
            meta = dict(self.meta)
        if meta["round"] <= self._written_round:
            return None
        with self.get_tensors() as shared:
            tensors = [t.clone() for t in shared]
        round_index = int(meta["round"])
        path = save_checkpoint(
            self.directory / f"round-{round_index:08d}.pt",
            self.workload,
            tensors,
            round_index,
            meta={"task_id": self.task_id, "attempt": int(meta.get("attempt", 0))},
        )
        self._written_round = round_index
        for old in checkpoint_files(self.directory)[: -self.keep]:
            old.unlink(missing_ok=True)
        logger.info(f"checkpoint of round {round_index} written to {path}")
        return path

    def fetch(self, timeout: float = 60.0) -> Path | None:
        """Download the newest state and write it as a checkpoint (both only if it is new)."""
        self.download(timeout)
        return self.write_checkpoint()

    # ------------------------------------------------------------------ states for audits

    def _remember(self, state_digest: str, tensors: list[torch.Tensor]) -> None:
        with self._cache_changed:
            self._cache[state_digest] = [t.clone() for t in tensors]
            while len(self._cache) > self._cache_size:
                self._cache.pop(next(iter(self._cache)))
            self._cache_changed.notify_all()

    def state_for(self, state_digest: str, wait: float = 0.0) -> list[torch.Tensor] | None:
        """The state with consensus digest ``state_digest``, if downloaded recently (waits up to ``wait``)."""
        with self._cache_changed:
            self._cache_changed.wait_for(lambda: state_digest in self._cache, timeout=wait)
            found = self._cache.get(state_digest)
            return None if found is None else [t.clone() for t in found]

    def newest_round(self) -> int:
        path = newest_checkpoint(self.directory)
        return -1 if path is None else int(read_checkpoint(path)["round"])
