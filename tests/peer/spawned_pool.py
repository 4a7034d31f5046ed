"""A real worker pool for tests: one spawned CPU worker training a small digits supernet (or a forked
one, given processes forked to wait for it: :class:`peer.worker_fork.WaitingWorkers`)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from peer.devices import WorkerDevice
from peer.worker import WorkerLimits
from peer.worker_fork import WaitingWorkers
from peer.worker_pool import WorkerPool
from peer.worker_protocol import SharedBuffers
from supernet.state import init_optimizer_state, state_tensors
from supernet.workload import workload_for


@contextmanager
def spawned_pool(
    options: dict,
    task_seed: int,
    prefix: str,
    *,
    threads: int | None = None,
    limits: WorkerLimits = WorkerLimits(),
    waiting: WaitingWorkers | None = None,
) -> Iterator[tuple[WorkerPool, int]]:
    """The pool (its ``shared.state`` starts with the parameters) and how many parameters there are;
    the worker is stopped on exit. Set ``MANTA_WORKER_THREADS`` first (or ``threads``) to keep it to
    one thread; ``limits``: what the volunteer lends it."""
    workload = workload_for("digits", options)
    net = workload.build()
    optimizer = workload.make_optimizer(net)
    init_optimizer_state(net, optimizer)
    shared = SharedBuffers.create(list(net.parameters()), state_tensors(net, optimizer), 1)
    pool = WorkerPool(
        [WorkerDevice("cpu", 0, "test cpu", 1024)], shared, task_name="digits", task_seed=task_seed,
        participant_prefix=prefix, train_options=options, threads=threads, limits=limits, waiting=waiting,
    )  # fmt: skip
    try:
        yield pool, len(list(net.parameters()))
    finally:
        pool.stop()
