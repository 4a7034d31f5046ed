"""CPU workers forked from the agent before it starts a second thread, sharing the torch it imported.

A spawned worker imports torch itself: about 290 MiB of private memory and 4 s of CPU per worker
(benchmarks/RESULTS.md, "What a peer costs its host"). A fork of the agent made right after its
imports shares those pages instead (the imported objects are frozen first, so the collector never
writes to them). A fork is safe only while the agent runs one thread (a lock another thread held
would stay held in the child) and has not touched CUDA: :meth:`WaitingWorkers.fork_for` forks for
CPU devices in a one-thread process only, and otherwise returns None, and the pool spawns.

Each forked process waits on its pipe for the spec and the shared memory of the worker it becomes
(:func:`hand_over`); the shared tensors' file descriptors cross the pipe as SCM_RIGHTS messages.
"""

from __future__ import annotations

import atexit
import gc
import multiprocessing
import multiprocessing.context
import os
import pickle
import socket
from collections.abc import Sequence
from multiprocessing.reduction import ForkingPickler

from hivemind_adapter.runtime import set_parent_death_signal
from peer.devices import WorkerDevice

FDS_PER_MESSAGE = 200  # the kernel takes at most 253 (SCM_MAX_FD) in one message
CLOSE_SECONDS = 5.0


def threads_in_this_process() -> int:
    return len(os.listdir("/proc/self/task"))


class WaitingWorkers:
    """Processes forked from the agent, each waiting for the worker it will be (:func:`hand_over`);
    :meth:`close` ends those never taken."""

    def __init__(self, count: int):
        gc.freeze()  # the imported objects stay where they are: the collector never dirties their pages
        atexit.register(gc.unfreeze)  # collected at the agent's exit (triton reports them leaked otherwise)
        context = multiprocessing.get_context("fork")
        self._waiting: list[tuple[multiprocessing.Process, object]] = []
        for _ in range(count):
            parent, child = context.Pipe()
            agent_ends = [parent, *(end for _, end in self._waiting)]  # the child closes its copies
            # a daemon (ended at the agent's exit, however it left): a CPU worker starts no process
            process = context.Process(
                target=_wait_for_work, args=(child, agent_ends), name="manta-worker", daemon=True
            )
            process.start()
            child.close()
            self._waiting.append((process, parent))

    @classmethod
    def fork_for(cls, devices: Sequence[WorkerDevice]) -> WaitingWorkers | None:
        """One waiting process per device if every device is a CPU and this process runs one thread;
        None otherwise (then the pool spawns fresh interpreters)."""
        if not devices or any(d.kind != "cpu" for d in devices) or threads_in_this_process() != 1:
            return None
        return cls(len(devices))

    def take(self) -> tuple[multiprocessing.Process, object] | None:
        """A waiting process and the agent's end of its pipe, or None if none is left."""
        return self._waiting.pop(0) if self._waiting else None

    def close(self) -> None:
        """End the processes never taken (bounded: they leave on their pipe's end, or are killed)."""
        for _, conn in self._waiting:
            conn.close()
        for process, _ in self._waiting:
            process.join(CLOSE_SECONDS)
            if process.is_alive():
                process.kill()
                process.join(CLOSE_SECONDS)
        self._waiting = []


class _FdCollector:
    """Stands in for multiprocessing's spawning ``Popen`` while a worker's work is pickled: each file
    descriptor a shared tensor's reduction passes is collected, and pickled as its index."""

    def __init__(self):
        self.fds: list[int] = []

    def duplicate_for_child(self, fd: int) -> int:
        self.fds.append(fd)
        return len(self.fds) - 1

    def DupFd(self, index: int) -> _PassedFd:  # noqa: N802 (the name multiprocessing calls)
        return _PassedFd(index)


# In a waiting process: the file descriptors received, by their index in the sender's collector.
_received: dict[int, int] = {}


class _PassedFd:
    def __init__(self, index: int):
        self.index = index

    def detach(self) -> int:
        return _received.pop(self.index)


def hand_over(conn, work: tuple) -> None:
    """Send ``work``, a worker's ``(spec, shared)`` (:func:`peer.worker.worker_main`), to a waiting
    process over ``conn``: the count of file descriptors, the descriptors, then the pickle."""
    collector = _FdCollector()
    multiprocessing.context.set_spawning_popen(collector)
    try:
        payload = ForkingPickler.dumps(work)
    finally:
        multiprocessing.context.set_spawning_popen(None)
    conn.send(len(collector.fds))
    with socket.socket(fileno=os.dup(conn.fileno())) as sock:
        for start in range(0, len(collector.fds), FDS_PER_MESSAGE):
            socket.send_fds(sock, [b"f"], collector.fds[start : start + FDS_PER_MESSAGE])
    conn.send_bytes(payload)


def _wait_for_work(conn, agent_ends: list) -> None:
    """A waiting process: become the worker handed over, or leave when the agent closes the pipe
    (which it sees only once it closed its own copies of the agent's ends)."""
    from peer.worker import worker_main

    set_parent_death_signal()
    for end in agent_ends:
        end.close()
    try:
        count = conn.recv()
        fds: list[int] = []
        with socket.socket(fileno=os.dup(conn.fileno())) as sock:
            while len(fds) < count:
                _, got, _, _ = socket.recv_fds(sock, 1, FDS_PER_MESSAGE)
                if not got:
                    raise EOFError
                fds.extend(got)
        payload = conn.recv_bytes()
    except (EOFError, OSError, KeyboardInterrupt):
        os._exit(0)  # no worker was handed over
    _received.update(enumerate(fds))
    spec, shared = pickle.loads(payload)
    worker_main(spec, conn, shared)
