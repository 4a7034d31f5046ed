"""The running peer's local control: ``manta-peer pause | resume | status`` talk to it through a Unix
socket in its data directory (:data:`SOCKET_NAME`), one JSON request and one JSON reply per
connection. Only the machine's users who can open the data directory can reach it."""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

logger = logging.getLogger("manta.peer")

SOCKET_NAME = "control.sock"
COMMANDS = ("status", "pause", "resume")
REPLY_TIMEOUT = 10.0  # seconds a client waits for the peer's answer
MAX_REQUEST = 4096


class ControlError(RuntimeError):
    """No running peer answers, or it refused the request; the message is one line for the user."""


class PeerControl:
    """What the control socket reads and sets, between the socket's thread and the round loop: the
    user's pause request and the peer's status (the loop keeps it current)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # guards the two fields below
        self._paused_by_user = False
        self._status: dict[str, Any] = {"state": "starting"}

    def paused_by_user(self) -> bool:
        with self._lock:
            return self._paused_by_user

    def update(self, **fields: Any) -> None:
        """Set status fields (JSON values)."""
        with self._lock:
            self._status.update(fields)

    def status(self) -> dict[str, Any]:
        with self._lock:
            return {**self._status, "paused_by_user": self._paused_by_user}

    def handle(self, command: str) -> dict[str, Any]:
        """``pause`` and ``resume`` set the user's request (it takes effect between rounds); every
        command answers with the status."""
        if command in ("pause", "resume"):
            with self._lock:
                self._paused_by_user = command == "pause"
        return self.status()


class ControlServer:
    """Serves ``handle(command) -> reply`` on ``<data_dir>/control.sock`` from a thread of its own
    until :meth:`close`. A socket file left by a peer that died is replaced; one a live peer serves
    is not (raises :class:`ControlError`)."""

    def __init__(self, data_dir: Path, handle: Callable[[str], dict[str, Any]]):
        self.path = Path(data_dir) / SOCKET_NAME
        self.handle = handle
        if self.path.exists():
            if _answers(self.path):
                raise ControlError(f"another peer is running in {data_dir} (it answers on {self.path})")
            self.path.unlink()
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(str(self.path))
        os.chmod(self.path, 0o600)
        self._sock.listen(4)
        self._sock.settimeout(0.5)
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="manta-control", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # closed
            with conn:
                conn.settimeout(REPLY_TIMEOUT)
                try:
                    request = json.loads(conn.recv(MAX_REQUEST).decode() or "{}")
                    command = request.get("command") if isinstance(request, dict) else None
                    if command not in COMMANDS:
                        reply = {"ok": False, "error": f"unknown command {command!r}"}
                    else:
                        reply = {"ok": True, **self.handle(command)}
                    conn.sendall(json.dumps(reply).encode())
                except (OSError, ValueError) as e:
                    logger.debug(f"control request failed: {e}")

    def close(self, timeout: float = 5.0) -> None:
        """Stop serving and remove the socket file (bounded)."""
        self._closed.set()
        self._sock.close()
        self._thread.join(timeout)
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass


def request(data_dir: Path, command: str, timeout: float = REPLY_TIMEOUT) -> dict[str, Any]:
    """Send ``command`` to the peer running in ``data_dir``; its reply. Raises :class:`ControlError`
    if none answers or it refused."""
    path = Path(data_dir) / SOCKET_NAME
    if not path.exists():
        raise ControlError(f"no peer is running in {data_dir} (no {SOCKET_NAME} there)")
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect(str(path))
            s.sendall(json.dumps({"command": command}).encode())
            s.shutdown(socket.SHUT_WR)
            data = b"".join(iter(lambda: s.recv(65536), b""))
    except (ConnectionRefusedError, FileNotFoundError):
        raise ControlError(f"no peer is running in {data_dir} (its control socket does not answer)") from None
    except TimeoutError:
        raise ControlError(f"the peer in {data_dir} did not answer within {timeout:.0f} s") from None
    try:
        reply = json.loads(data.decode())
    except ValueError:
        raise ControlError(f"the peer in {data_dir} sent an unreadable answer") from None
    if not reply.get("ok"):
        raise ControlError(str(reply.get("error", "the peer refused the request")))
    return reply


def _answers(path: Path) -> bool:
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(1.0)
            s.connect(str(path))
        return True
    except OSError:
        return False
