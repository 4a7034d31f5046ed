"""Removing the unix sockets hivemind's averagers, and DHTs that failed to start, leave in ``/tmp``.

Every client of a p2pd daemon listens on a socket file of its own, ``/tmp/hivemind-p2pclient-*.sock``.
An averager opens one, which hivemind never closes. So an averager records its socket's path, closes
the client when it is shut down, and removes the file after it ended, which also covers one that had
to be stopped the hard way.

A DHT whose daemon gave up (no initial peer answered) leaves the daemon's socket file: the daemon exits
on its own and hivemind removes nothing (one per ``manta-peer join`` with a wrong address). The path is
made inside the DHT's process, so :func:`remove_dead_daemon_sockets` finds it afterwards: a daemon
socket file that appeared meanwhile and that nothing listens on any more.
"""

from __future__ import annotations

import contextlib
import glob
import os
import socket
import tempfile
import time


def daemon_socket_files() -> set[str]:
    """The p2pd daemons' socket files in the temp folder now."""
    return set(glob.glob(os.path.join(tempfile.gettempdir(), "hivemind-p2pd-*.sock")))


def remove_dead_daemon_sockets(before: set[str], patience: float = 2.0) -> list[str]:
    """Remove the daemon socket files that are not in ``before`` and that refuse a connection (their
    daemon is gone); returns them. One still listening is looked at again for ``patience`` seconds
    (the daemon that gave up may still be exiting); another process's daemon that started meanwhile
    keeps listening, and keeps its file."""
    removed: list[str] = []
    waiting = daemon_socket_files() - before
    deadline = time.monotonic() + patience
    while waiting:
        waiting = {path for path in waiting if not _removed_if_dead(path, removed)}
        if not waiting or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    return removed


def remove_dead_socket(path: str, patience: float = 5.0) -> bool:
    """Remove the socket file ``path`` once nothing listens on it (looked at for ``patience`` seconds,
    its process may still be ending). True if it is gone."""
    deadline = time.monotonic() + patience
    while not _removed_if_dead(path, []):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return not os.path.exists(path)


# A daemon binds its socket file before it listens on it, and refuses connections in between: a
# file younger than this is not judged (one removed so made its daemon unreachable, seen in CI).
YOUNG_SECONDS = 1.0


def _removed_if_dead(path: str, removed: list[str]) -> bool:
    """True once ``path`` is settled: removed (nothing listens on it) or gone; False while it listens
    or is too young to tell."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(1.0)
        probe.connect(path)
        return False
    except ConnectionRefusedError:
        try:
            if time.time() - os.stat(path).st_mtime < YOUNG_SECONDS:
                return False
        except FileNotFoundError:
            return True
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)
            removed.append(path)
        return True
    except OSError:  # gone already, or not ours to judge
        return True
    finally:
        probe.close()


def client_socket_path(p2p) -> str | None:
    """The file ``p2p`` (a hivemind P2P client) listens on, or None if it is not a unix socket."""
    try:
        return p2p._client_listen_maddr["unix"]  # hivemind's own attribute: this module is its one reader
    except (AttributeError, KeyError, TypeError):
        return None


class RemovesItsSocket:
    """Mixin for a ``DecentralizedAverager`` subclass (listed before it): its p2p client is closed at
    shutdown and the client's socket file is removed, whichever way the averager ended."""

    socket_path = ""  # the file its p2p client listens on, once its served side started

    # hivemind_adapter.in_thread sets self._p2p once, right after replicating the client
    @property
    def _p2p(self):
        try:
            return self.__dict__["_p2p_client"]
        except KeyError:  # set only once the averager's served side started
            raise AttributeError("_p2p") from None

    @_p2p.setter
    def _p2p(self, p2p) -> None:
        self.__dict__["_p2p_client"] = p2p
        self.socket_path = client_socket_path(p2p) or ""

    async def _shutdown(self, timeout) -> None:
        try:
            await super()._shutdown(timeout)
        finally:
            if (p2p := self.__dict__.get("_p2p_client")) is not None:
                await p2p.shutdown()  # closes the client and removes its socket file

    def shutdown(self) -> None:
        try:
            super().shutdown()
        finally:
            self.remove_socket_file()

    def remove_socket_file(self) -> None:
        """Remove the averager's socket file if it has ended and left it."""
        if self.is_alive():
            return
        if self.socket_path:
            with contextlib.suppress(FileNotFoundError):
                os.remove(self.socket_path)
