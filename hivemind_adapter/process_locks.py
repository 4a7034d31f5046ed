"""Locks that a killed process cannot leave held.

hivemind makes its cross-process locks with ``multiprocessing.Lock`` (a POSIX semaphore) at import.
``MPFuture._update_lock`` orders every process's writes of a future's result into the pipe of the
process that awaits it, and it is one semaphore for the whole process tree: a peer, its DHT's process
and every averager. A process killed between its write and the release (a SIGKILLed DHT's process, an
averager stopped the hard way, the OOM killer) leaves the semaphore held for ever, and every later
result in the tree waits on it: every DHT call, every DHT or averager start, hangs
(benchmarks/RESULTS.md, "Processes that die"). An averager's ``lock_averaged_tensors`` is the same
kind of lock between the averager's process and its parent.

:class:`DeathSafeLock` is held through a POSIX record lock (``fcntl.lockf``) on an unlinked file of
its own, which the kernel releases when the holding process ends, however it ends; a thread lock
orders the threads of one process. Locks that guard only one process's own state (hivemind's
per-process future backend, executor and shared-byte buffers) need no other process at all:
:class:`ForkLocalLock`. :func:`install_death_safe_locks` puts them in hivemind's place; it must run
before the process starts its first hivemind child, so that the tree shares one update lock
(``start_dht`` calls it).
"""

from __future__ import annotations

import fcntl
import os
import tempfile
import threading
import time
import weakref

_after_fork: weakref.WeakSet = weakref.WeakSet()  # locks whose thread lock a forked child remakes
_installed = False


def _remake_thread_locks() -> None:
    # In a forked child only the forking thread exists: a thread lock some other thread held at the
    # fork would stay held for ever in the child's copy.
    for lock in list(_after_fork):
        lock._threads = threading.Lock()


os.register_at_fork(after_in_child=_remake_thread_locks)


class ForkLocalLock:
    """A thread lock for state each process keeps for itself; a forked child gets a fresh one."""

    def __init__(self) -> None:
        self._threads = threading.Lock()
        _after_fork.add(self)

    def acquire(self, block: bool = True, timeout: float | None = None) -> bool:
        return self._threads.acquire(block, -1 if timeout is None or not block else timeout)

    def release(self) -> None:
        self._threads.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


class DeathSafeLock(ForkLocalLock):
    """A lock between the processes forked from its maker (and their threads), released by the kernel
    when the process holding it ends. Shared by fork only: it cannot be pickled to another process."""

    def __init__(self) -> None:
        super().__init__()
        fd, path = tempfile.mkstemp(prefix="manta-lock-")
        os.unlink(path)  # nothing to clean up; every forked child shares the open file
        self._fd = fd

    def acquire(self, block: bool = True, timeout: float | None = None) -> bool:
        deadline = None if timeout is None or not block else time.monotonic() + max(timeout, 0.0)
        if not super().acquire(block, timeout):
            return False
        try:
            if block and deadline is None:
                fcntl.lockf(self._fd, fcntl.LOCK_EX, 1, 0, os.SEEK_SET)
                return True
            while True:  # non-blocking or bounded: try, then poll until the deadline
                try:
                    fcntl.lockf(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0, os.SEEK_SET)
                    return True
                except (BlockingIOError, PermissionError):  # held by another process
                    if deadline is None or time.monotonic() >= deadline:
                        super().release()
                        return False
                    time.sleep(0.001)
        except BaseException:
            super().release()
            raise

    def release(self) -> None:
        fcntl.lockf(self._fd, fcntl.LOCK_UN, 1, 0, os.SEEK_SET)
        super().release()

    def __reduce__(self):
        raise TypeError("a DeathSafeLock is shared with child processes by fork, not by pickling")

    def __del__(self) -> None:
        fd = getattr(self, "_fd", None)
        if fd is not None:
            os.close(fd)


def install_death_safe_locks() -> None:
    """Put :class:`DeathSafeLock` and :class:`ForkLocalLock` in place of hivemind's import-time
    ``multiprocessing`` locks, once per process tree. Call before this process forks any hivemind
    process: a child forked earlier keeps the semaphore, and the tree would then use two locks."""
    global _installed
    if _installed:
        return
    from hivemind.utils.asyncio import _AsyncContextWrapper
    from hivemind.utils.mpfuture import MPFuture, SharedBytes

    MPFuture._update_lock = DeathSafeLock()  # the one pipe-writing lock of the tree
    MPFuture._initialization_lock = ForkLocalLock()  # each process's own future backend
    SharedBytes._lock = ForkLocalLock()  # each process's own shared-byte buffer
    _AsyncContextWrapper.EXECUTOR_LOCK = ForkLocalLock()  # each process's own executor
    _installed = True
