"""Process conventions for every MANTA process that touches hivemind.

hivemind's DHT is a fork-started process and its averager a plain ``mp.Process`` that must inherit
(not pickle) its state, so the ``fork`` start method is required (Python 3.14 and macOS default to
others, which break ``DecentralizedAverager`` with a pickling error). hivemind also sets a torch
sharing strategy at import time from ``HIVEMIND_MEMORY_SHARING_STRATEGY``; its default
(``file_system``) starts a ``torch_shm_manager`` helper that outlives a killed parent, so we choose
``file_descriptor``. Both choices must be made before hivemind is imported, in exactly one place:
:func:`prepare_process`.

The rest of the module is supervision: a child asks the kernel to signal it when its parent dies,
and a parent can stop its whole process tree. Pure standard library plus psutil; no torch or
hivemind import here.
"""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import warnings

import psutil

from hivemind_adapter.pipe_sharing import install_quiet_pipe_sharing

SHARING_STRATEGY = "file_descriptor"
_PR_SET_PDEATHSIG = 1
_M_ARENA_MAX = -8  # glibc's mallopt parameter
# malloc arenas per process: glibc makes up to 8 per core, one per thread that allocates at once, and
# keeps what each held; a peer's threads mostly wait, so two serve it (-80 MiB of PSS per agent)
MALLOC_ARENAS = 2


def prepare_process() -> None:
    """Make this process safe for hivemind. Call before the first ``import hivemind``."""
    os.environ.setdefault("HIVEMIND_MEMORY_SHARING_STRATEGY", SHARING_STRATEGY)
    # numpy's and scipy's OpenBLAS each start a thread per further core at import; MANTA's BLAS work is
    # torch's, and a peer forks its CPU workers while it runs one thread (peer/worker_fork.py)
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    # hivemind scripts a helper with torch.jit at import; the deprecation notice is not the user's concern.
    warnings.filterwarnings("ignore", message=r"`torch\.jit\.script` is deprecated", category=FutureWarning)
    if "hivemind" in sys.modules and _torch_sharing_strategy() not in (None, SHARING_STRATEGY):
        # hivemind chose the strategy at its import, before the variable above was set: its default
        # would start a torch_shm_manager per process, whose folders outlive a killed peer in /tmp.
        raise RuntimeError("hivemind was imported before hivemind_adapter.runtime.prepare_process()")
    if mp.get_start_method(allow_none=True) != "fork":
        mp.set_start_method("fork", force=True)
    limit_malloc_arenas()
    install_quiet_pipe_sharing()  # a killed DHT or averager process mid-fetch: one line, not a traceback


def limit_malloc_arenas() -> None:
    """At most :data:`MALLOC_ARENAS` malloc arenas in this process and the interpreters it starts
    (glibc reads the variable as a process starts). No-op off glibc."""
    os.environ.setdefault("MALLOC_ARENA_MAX", str(MALLOC_ARENAS))
    libc = _glibc()
    if libc is not None:
        libc.mallopt(_M_ARENA_MAX, int(os.environ["MALLOC_ARENA_MAX"]))


def return_free_memory() -> None:
    """Give the pages malloc holds free back to the kernel (after a round's buffers were released;
    a few milliseconds). No-op off glibc."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)


def _glibc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.mallopt, libc.malloc_trim  # noqa: B018 (musl has neither)
    except (OSError, AttributeError):
        return None
    return libc


def _torch_sharing_strategy() -> str | None:
    """torch's tensor sharing strategy in this process, if torch is loaded (never imports it)."""
    torch_mp = sys.modules.get("torch.multiprocessing")
    return None if torch_mp is None else torch_mp.get_sharing_strategy()


def set_parent_death_signal(sig: int = signal.SIGTERM) -> bool:
    """Ask Linux to send ``sig`` to this process when its parent exits (even by SIGKILL).

    Returns False where unsupported (non-Linux); callers then rely on the parent's own cleanup.
    """
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        return False
    # The parent may have died between fork and prctl; then nobody will signal us.
    if os.getppid() == 1:
        os.kill(os.getpid(), sig)
    return True


def start_orphan_reaper() -> subprocess.Popen:
    """Start the watcher (:mod:`hivemind_adapter.reaper`) that kills this process's descendants if it dies.

    Call it once, early, in every long-running MANTA process (peer, aggregator, swarm launcher). The
    watcher exits by itself after this process exits; a normal shutdown stops children first, so it
    then finds nothing to kill.
    """
    # multiprocessing's folder this process already has (inherited from its parent at fork, or its
    # own): shared with processes outside the tree, so the watcher keeps it (util.get_temp_dir's cache)
    inherited = mp.current_process()._config.get("tempdir")
    command = [sys.executable, "-m", "hivemind_adapter.reaper", str(os.getpid())]
    return subprocess.Popen(
        command + ([inherited] if inherited else []),
        stdin=subprocess.DEVNULL,
        close_fds=True,
    )


def descendants(pid: int | None = None) -> list[psutil.Process]:
    """All living descendants of ``pid`` (default: this process)."""
    try:
        return psutil.Process(pid or os.getpid()).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def terminate_processes(procs: list[psutil.Process], timeout: float = 5.0) -> list[psutil.Process]:
    """SIGTERM, wait up to ``timeout``, then SIGKILL the stragglers. Returns the processes that were
    still alive when SIGTERM was sent (i.e. those this call had to stop)."""
    alive = [p for p in procs if _alive(p)]
    for p in alive:
        try:
            p.terminate()
        except psutil.NoSuchProcess:
            pass
    _, remaining = psutil.wait_procs(alive, timeout=timeout)
    for p in remaining:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(remaining, timeout=timeout)
    return alive


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
