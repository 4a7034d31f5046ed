"""The agent's side of its workers: one process per device, started, asked and stopped here.

A worker is a process forked from the agent before its first thread, handed its work
(:mod:`peer.worker_fork`: CPU workers), or a fresh interpreter spawned (a GPU's: a CUDA context must
not be inherited). Either shares :class:`~peer.worker_protocol.SharedBuffers` with the agent. This is
the only agent-side code that speaks :mod:`peer.worker_protocol`; a round sees typed methods.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Sequence
from multiprocessing.process import BaseProcess

import torch

from peer.devices import WorkerDevice
from peer.worker import WorkerLimits, WorkerSpec, default_threads, worker_main
from peer.worker_fork import WaitingWorkers, hand_over
from peer.worker_protocol import (
    Applied,
    Apply,
    Compute,
    HostContribution,
    Load,
    Loaded,
    SharedBuffers,
    Stop,
    WorkerFailed,
)
from peer.worker_spawn import WorkerProcess

POLL_SECONDS = 0.05
STOP_GRACE_SECONDS = 10.0


class WorkerDied(RuntimeError):
    """A worker process ended or reported a failure; the peer cannot go on with this round."""


class WorkerPool:
    """One worker per device, all of one host, acting as one: every request goes to every worker
    and is complete when every worker has answered (rank 0 answers for the host)."""

    def __init__(
        self,
        devices: Sequence[WorkerDevice],
        shared: SharedBuffers,
        *,
        task_name: str,
        task_seed: int,
        participant_prefix: str,
        train_options: dict,
        data: tuple[str, str] | None = None,
        threads: int | None = None,
        limits: WorkerLimits = WorkerLimits(),
        waiting: WaitingWorkers | None = None,
    ):
        """``threads``: torch threads per worker (None: the cores shared out, or MANTA_WORKER_THREADS);
        ``limits``: the CPU share and GPU memory a worker may use; ``waiting``: forked processes to
        become the workers (as many as it holds; the rest are spawned)."""
        self.shared = shared
        self._workers: list[tuple[BaseProcess, object]] = []
        ctx = torch.multiprocessing.get_context("spawn")
        port = _free_port()
        threads = threads or default_threads(len(devices))
        for rank, device in enumerate(devices):
            spec = WorkerSpec(
                rank,
                len(devices),
                device.torch_device,
                port,
                task_name,
                task_seed,
                f"{participant_prefix}/{rank}",
                train_options,
                threads,
                data,
                limits,
            )
            forked = waiting.take() if waiting is not None else None
            if forked is not None:
                proc, parent = forked
                try:
                    hand_over(parent, (spec, shared))
                except OSError as e:  # it ended while it waited
                    raise WorkerDied(
                        f"worker {proc.pid} ended before it started (exit code {proc.exitcode}): {e}"
                    ) from None
            else:
                # Not a daemon: a GPU worker decodes its mini-batches in processes of its own
                # (supernet.batch_prefetch; benchmarks/RESULTS.md, "Input pipeline (GPU)"), and a daemon
                # may not have children. It still cannot outlive the agent: it asks
                # the kernel for a signal when its parent dies, and stop() always ends it.
                parent, child = ctx.Pipe()
                proc = WorkerProcess(target=worker_main, args=(spec, child, shared), daemon=False)
                proc.start()
            self._workers.append((proc, parent))

    @property
    def size(self) -> int:
        return len(self._workers)

    # ------------------------------------------------------------------ the round's requests

    def start_compute(self, request: Compute) -> None:
        """Start the round's computation; poll :meth:`computed` while deciding when to stop it."""
        self.shared.stop.zero_()
        self.shared.progress.zero_()
        self._send(request)

    def raise_stop_flag(self) -> None:
        """The swarm has (or will have) enough samples: workers finish their mini-batch and reduce."""
        self.shared.stop[0] = 1

    @property
    def stop_flag_raised(self) -> bool:
        return bool(int(self.shared.stop[0]))

    def progress(self) -> tuple[float, float]:
        """Samples and loss sum over every worker so far in this round (finished mini-batches)."""
        samples, loss_sum, _ = (float(x) for x in self.shared.progress.sum(dim=0))
        return samples, loss_sum

    def worker_samples(self) -> tuple[int, ...]:
        """Each worker's sample count this round (what the receipt lists)."""
        return tuple(int(x) for x in self.shared.progress[:, 0].tolist())

    def computed(self, timeout: float) -> HostContribution | None:
        """The host's contribution once every worker has reduced; None if still busy after ``timeout``."""
        replies = self._replies(timeout)
        return None if replies is None else _only(replies, HostContribution)

    def host_numerator(self) -> list[torch.Tensor]:
        """After :meth:`computed`: the host's gradient numerator (the shared buffer itself)."""
        return self.shared.grads

    def apply(self, round_index: int, swarm_average: Sequence[torch.Tensor] | None) -> float | None:
        """Take the round's optimizer step from ``swarm_average`` (None: the round aborted, no step);
        returns the step's learning rate."""
        if swarm_average is not None:
            for dst, src in zip(self.shared.grads, swarm_average):
                dst.copy_(src)
        self._send(Apply(round_index, swarm_average is not None))
        return _only(self._replies(None), Applied).lr

    def load(self, state: Sequence[torch.Tensor]) -> None:
        """Make ``state`` every worker's model and optimizer state."""
        for dst, src in zip(self.shared.state, state):
            dst.copy_(src)
        self._send(Load())
        _only(self._replies(None), Loaded)

    # ------------------------------------------------------------------ plumbing

    def _send(self, request) -> None:
        for _, conn in self._workers:
            conn.send(request)

    def _replies(self, timeout: float | None) -> list | None:
        """Every worker's reply to the last request; None if one is still busy after ``timeout`` s."""
        deadline = None if timeout is None else time.monotonic() + timeout
        replies = []
        for proc, conn in self._workers:
            while not conn.poll(POLL_SECONDS):
                if not proc.is_alive():
                    raise WorkerDied(f"worker {proc.pid} died (exit code {proc.exitcode})")
                if deadline is not None and time.monotonic() > deadline:
                    return None
            try:
                replies.append(conn.recv())
            except (EOFError, OSError) as e:  # the worker died while sending (or its pipe broke)
                proc.join(timeout=5)
                raise WorkerDied(f"worker {proc.pid} went away (exit code {proc.exitcode}): {e}") from None
        for reply in replies:
            if isinstance(reply, WorkerFailed):
                raise WorkerDied(f"worker failed: {reply.message}")
        return replies

    def stop(self) -> None:
        """Ask every worker to leave, kill what has not within the grace (bounded)."""
        # A worker in the middle of a round (a peer that lost its swarm, a second Ctrl-C) computes
        # until this flag rises: raised, it finishes its mini-batch and reads the request to leave,
        # instead of computing through the whole grace and being killed.
        self.raise_stop_flag()
        for _proc, conn in self._workers:
            try:
                conn.send(Stop())
            except OSError:
                pass
        deadline = time.monotonic() + STOP_GRACE_SECONDS
        for proc, _ in self._workers:
            proc.join(timeout=max(0.1, deadline - time.monotonic()))
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)


def _only(replies: list, kind: type):
    """Rank 0's reply, after checking every worker answered with ``kind``."""
    for reply in replies:
        if not isinstance(reply, kind):
            raise WorkerDied(f"a worker answered {type(reply).__name__} instead of {kind.__name__}")
    return replies[0]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
