"""A watcher that stops a process's whole tree when that process dies, even by SIGKILL.

hivemind starts a DHT process, averager processes and a Go ``p2pd`` daemon under a peer; if the peer
is killed, they are re-parented to init and run on. A parent-death
signal only reaches direct children, and the peer cannot use its own process group without leaving
the terminal's foreground group (Ctrl-C would no longer reach it). So a tiny watcher child keeps a
fresh snapshot of the watched process's descendants and, once that process is gone, kills every
process of the last snapshot (checking each one's start time, so a recycled pid is never hit). It
learns of the death from a pidfd, and reads the tree ever less often while the tree stands still.

Files too: a killed tree cannot remove the unix sockets it listened on (hivemind's
``/tmp/hivemind-p2p*.sock``, multiprocessing's listeners in ``/tmp/pymp-*``), and they would pile up
in ``/tmp``. The watcher also keeps the paths of those the tree listens on and removes
them once every process of the tree is gone. Their names are random per listener, so no other
process can be using them then. A ``pymp-*`` folder is removed too, once empty, unless the watched
process already had it when it started the watcher: forked children share their parent's folder, so
that one may belong to a process outside the tree that is still running (the one that started the
watched process, say). A folder made later was made inside the tree.

A path the tree held is not always the tree's own: a socket accepted on a listener carries the
listener's path, and a process forked while its parent's resource sharer was serving a connection
inherits that accepted socket. Removing such a path would unlink the parent's listener (and hang every
later DHT call of that parent). So once the tree
is gone, a path that some socket still alive is bound to is left alone: only processes outside the
tree can hold it then.

Run as ``python -m hivemind_adapter.reaper PID [KEPT_FOLDER]``;
:func:`hivemind_adapter.runtime.start_orphan_reaper` does that.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from hivemind_adapter.process_identity import start_ticks

SOCKET_PREFIX = "hivemind-p2p"  # hivemind's p2pd and p2p client sockets, in the temp folder
MP_FOLDER_PREFIX = "pymp-"  # multiprocessing's per-process folder of listener sockets
FIRST_LOOK = 0.25  # seconds between two reads of the tree while it changes
LAST_LOOK = 8.0  # ... and at most, once it has stood still
SOCKETS_LOOK = 1.0  # seconds between two reads of the namespace's socket table


def _snapshot(watched: psutil.Process) -> dict[int, int]:
    """The watched process's descendants (but this watcher): pid -> start (:func:`start_ticks`)."""
    try:
        procs = watched.children(recursive=True)
    except psutil.NoSuchProcess:
        return {}
    out = {}
    for p in procs:
        if p.pid == os.getpid():
            continue
        started = start_ticks(p.pid)
        if started is not None:
            out[p.pid] = started
    return out


def _daemon_sockets(pids: set[int]) -> set[Path]:
    """The socket files that ``pids``, if p2pd daemons, listen on: read from their command lines
    (``-listen=/unix/PATH``), which outlive a daemon that exits before the watcher kills it."""
    temp, out = tempfile.gettempdir(), set()
    for pid in pids:
        try:
            args = psutil.Process(pid).cmdline()
        except psutil.Error:
            continue
        for arg in args:
            if arg.startswith("-listen=/unix/") and _ours(path := arg[len("-listen=/unix") :], temp):
                out.add(Path(path))
    return out


def _ours(path: str, temp: str) -> bool:
    """Whether ``path`` is a socket file hivemind or multiprocessing makes in the folder ``temp``."""
    if not path.startswith(temp + os.sep):  # most of the machine's sockets: one string test
        return False
    file = Path(path)
    return (file.parent == Path(temp) and file.name.startswith(SOCKET_PREFIX)) or (
        file.parent.parent == Path(temp) and file.parent.name.startswith(MP_FOLDER_PREFIX)
    )


def _bound_sockets() -> dict[int, str]:
    """inode -> path of the living unix sockets of this network namespace that are bound to a path (an
    accepted connection shows its listener's). Read from ``/proc/net/unix``; empty if unreadable."""
    try:
        with open("/proc/net/unix") as table:
            next(table, None)  # the header
            return {int(fields[6]): fields[7] for line in table if len(fields := line.split()) == 8}
    except OSError:
        return {}


def _candidate_sockets() -> dict[int, str]:
    """:func:`_bound_sockets` bound to a file hivemind or multiprocessing makes (:func:`_ours`)."""
    temp = tempfile.gettempdir()
    return {inode: path for inode, path in _bound_sockets().items() if _ours(path, temp)}


def _socket_inodes(pids: list[int]) -> set[int]:
    """The inodes of the sockets the processes ``pids`` hold open."""
    inodes = set()
    for pid in pids:
        fd_dir = f"/proc/{pid}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:  # gone, or not ours to read
            continue
        for fd in fds:
            try:
                target = os.readlink(f"{fd_dir}/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(int(target[8:-1]))
    return inodes


class _SocketFiles:
    """The socket files (see :func:`_ours`) a tree's processes hold. Each look reads the namespace's
    socket table once; a process's open files are read only when a socket the tree may hold appeared."""

    def __init__(self) -> None:
        self.files: set[Path] = set()
        self._classified: set[int] = set()  # inodes already found the tree's, or not

    def look(self, tree: Callable[[], list[int]]) -> None:
        """``tree``: the tree's pids, read afresh (only when a new socket appeared: a process started
        since the last read of the tree may have made it)."""
        fresh = {inode: path for inode, path in _candidate_sockets().items() if inode not in self._classified}
        if not fresh:
            return
        held = _socket_inodes(tree())
        self.files |= {Path(path) for inode, path in fresh.items() if inode in held}
        # a socket is made by one process: one outside the tree now stays outside it
        self._classified |= fresh.keys()

    def of(self, pids: list[int]) -> set[Path]:
        """What ``pids`` hold now, read afresh."""
        held = _socket_inodes(pids)
        return {Path(path) for inode, path in _candidate_sockets().items() if inode in held}


def remove_files(paths: set[Path], kept_folder: str | None = None) -> None:
    """Remove ``paths`` but those a living socket is still bound to (held outside the tree), then each
    ``pymp-*`` folder they were in that is now empty (but ``kept_folder``)."""
    bound = set(_bound_sockets().values())
    for path in paths:
        if str(path) in bound:
            continue
        try:
            path.unlink()
        except OSError:  # gone already (its owner removed it), or not ours to remove
            pass
    kept = Path(kept_folder) if kept_folder else None
    for folder in {p.parent for p in paths if p.parent.name.startswith(MP_FOLDER_PREFIX)} - {kept}:
        try:
            folder.rmdir()  # only if empty: a listener of a process still running keeps it
        except OSError:
            pass


def watch(pid: int, kept_folder: str | None = None) -> int:
    """Block until ``pid`` exits, then kill its last known descendants and remove their socket files
    (and their multiprocessing folders, but ``kept_folder``). Returns how many were killed.

    The exit is waited for on a pidfd (woken at once, no polling where the kernel has them); the tree
    is read every :data:`FIRST_LOOK` s while it changes, then ever less often, up to every
    :data:`LAST_LOOK` s once it has been still a while (a peer starts its children as it starts); the
    namespace's socket table every :data:`SOCKETS_LOOK` s, and the tree's open files only when a socket
    it may hold appeared there. A p2pd daemon's socket is known from its command line as soon as the
    daemon is seen: one may exit by itself once its parent is gone (a write to its closed stdout)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the watched process, not for us
    try:
        watched = psutil.Process(pid)
        exited = _exit_waiter(pid)
    except psutil.NoSuchProcess:
        return 0
    known: dict[int, int] = {}
    sockets = _SocketFiles()

    def read_tree() -> dict[int, int]:  # what it sees is known from then on, a daemon's socket too
        seen = _snapshot(watched)
        sockets.files |= _daemon_sockets(seen.keys() - known.keys())
        known.update(seen)
        return seen

    interval, next_look = FIRST_LOOK, 0.0
    while True:
        if time.monotonic() >= next_look:
            before = set(known)
            grew = bool(read_tree().keys() - before)
            known = {p: t for p, t in known.items() if psutil.pid_exists(p)}
            interval = FIRST_LOOK if grew else min(LAST_LOOK, interval * 2)
            next_look = time.monotonic() + interval
        sockets.look(lambda: [pid, *read_tree()])
        if exited(min(SOCKETS_LOOK, max(0.0, next_look - time.monotonic()))):
            break
    victims = []
    for p, started in known.items():
        try:
            if start_ticks(p) == started:  # not a recycled pid
                victims.append(psutil.Process(p))
        except psutil.NoSuchProcess:
            pass
    files = sockets.files | sockets.of([p.pid for p in victims])  # what they hold now, however late
    for proc in victims:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(victims, timeout=5)
    remove_files(files, kept_folder)
    return len(victims)


def _exit_waiter(pid: int):
    """``wait(seconds) -> bool``: whether process ``pid`` has exited, waiting at most ``seconds``."""
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):  # no pidfd here: look every so often
        watched = psutil.Process(pid)

        def poll(seconds: float) -> bool:
            deadline = time.monotonic() + seconds
            while True:
                try:
                    if not watched.is_running() or watched.status() == psutil.STATUS_ZOMBIE:
                        return True
                except psutil.NoSuchProcess:
                    return True
                if time.monotonic() >= deadline:
                    return False
                time.sleep(min(FIRST_LOOK, max(0.0, deadline - time.monotonic())))

        return poll

    def wait(seconds: float) -> bool:
        readable, _, _ = select.select([fd], [], [], seconds)
        return bool(readable)

    return wait


if __name__ == "__main__":
    sys.exit(0 if watch(int(sys.argv[1]), kept_folder=sys.argv[2] if len(sys.argv) > 2 else None) >= 0 else 1)
