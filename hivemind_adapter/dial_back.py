"""Dial-back: a node asks another to open a plain TCP connection to its listening ports, to learn
whether the swarm can reach it (behind NAT or a firewall its connections go out and none come in).

The service dials only the IP addresses the caller's own connections to it come from (the daemon's
list of open connections names each one's remote address), at the ports the caller names: it cannot
be made to connect to any third party. A port counts as reachable when it speaks libp2p (a libp2p
listener sends multistream-select's header as soon as a connection opens). Every dial is bounded
(:data:`DIAL_SECONDS`), each caller is rate-limited by peer id and by IP, and requests in flight
are capped.

Wire format (JSON): the request ``{"ports": [PORT, ...]}`` (at most :data:`MAX_PORTS`); the reply
``{"seen_from": [HOST, ...], "dialed": [{"host", "port", "outcome"}, ...]}`` or ``{"error": TEXT}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import time
from collections import deque
from dataclasses import dataclass

from hivemind_adapter.p2p import Endpoint
from protocol.handler_names import DIAL_BACK_HANDLER

DIAL_SECONDS = 3.0  # one dial, connection and libp2p's first bytes together
CALL_SECONDS = DIAL_SECONDS + 7.0  # a request as the caller waits for it: the dials and the call's trips
MAX_PORTS = 4
MAX_HOSTS = 4  # a caller connected from more addresses than this has the first ones dialled
WINDOW_SECONDS = 60.0
CALLS_PER_PEER = 6  # requests per window from one peer id
CALLS_PER_IP = 60  # from one IP: many volunteers may share one router's address
MAX_IN_FLIGHT = 16
LIBP2P_HEADER = b"\x13/multistream/1.0.0\n"  # what a libp2p listener sends first
REACHABLE = "libp2p"  # the outcome of a dial that found a libp2p node


@dataclass(frozen=True)
class Dial:
    host: str
    port: int
    outcome: str  # REACHABLE, "not libp2p", "no answer", "refused" or "unreachable"

    @property
    def address(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


@dataclass(frozen=True)
class DialBack:
    """What one node found when it dialled the caller back."""

    asked: str  # that node's peer id
    seen_from: tuple[str, ...]  # the IPs the caller's connections to it came from
    dialed: tuple[Dial, ...]

    def reachable(self) -> tuple[Dial, ...]:
        return tuple(d for d in self.dialed if d.outcome == REACHABLE)


class _RateLimit:
    """At most ``calls`` per ``window`` seconds per key; memory bounded by forgetting idle keys."""

    def __init__(self, calls: int, window: float):
        self.calls, self.window = calls, window
        self._seen: dict[str, deque[float]] = {}

    def _queue(self, key: str, now: float) -> deque[float]:
        if len(self._seen) > 10_000:
            self._seen = {k: q for k, q in self._seen.items() if q and now - q[-1] < self.window}
        queue = self._seen.setdefault(key, deque())
        while queue and now - queue[0] >= self.window:
            queue.popleft()
        return queue

    def full(self, key: str) -> bool:
        return len(self._queue(key, time.monotonic())) >= self.calls

    def take(self, key: str) -> None:
        self._queue(key, time.monotonic()).append(time.monotonic())


def _host_of(maddr: str) -> str | None:
    parts = maddr.split("/")
    if len(parts) < 3 or parts[1] not in ("ip4", "ip6") or "p2p-circuit" in parts:
        return None
    try:
        return str(ipaddress.ip_address(parts[2]))
    except ValueError:
        return None


async def dial(host: str, port: int, seconds: float = DIAL_SECONDS) -> str:
    """Open a TCP connection to ``host:port`` and read libp2p's first bytes; the outcome, within
    ``seconds``. Nothing is sent."""
    writer = None
    try:
        async with asyncio.timeout(seconds):
            try:
                reader, writer = await asyncio.open_connection(host, port)
            except ConnectionRefusedError:
                return "refused"
            except OSError:
                return "unreachable"
            try:
                header = await reader.readexactly(len(LIBP2P_HEADER))
            except (asyncio.IncompleteReadError, OSError):
                return "not libp2p"
            return REACHABLE if header == LIBP2P_HEADER else "not libp2p"
    except TimeoutError:
        return "no answer" if writer is None else "not libp2p"
    finally:
        if writer is not None:
            writer.close()
            with contextlib.suppress(Exception):
                async with asyncio.timeout(1.0):
                    await writer.wait_closed()


class DialBackService:
    """Answers :data:`DIAL_BACK_HANDLER` on ``endpoint`` (see the module docstring)."""

    def __init__(self, endpoint: Endpoint):
        self.endpoint = endpoint
        self._per_peer = _RateLimit(CALLS_PER_PEER, WINDOW_SECONDS)
        self._per_ip = _RateLimit(CALLS_PER_IP, WINDOW_SECONDS)
        self._in_flight = 0

    def serve(self) -> DialBackService:
        self.endpoint.serve(DIAL_BACK_HANDLER, self._handle)
        return self

    async def _handle(self, payload: bytes, sender: str) -> bytes:
        return json.dumps(await self.answer(payload, sender)).encode()

    async def answer(self, payload: bytes, sender: str) -> dict:
        try:
            ports = json.loads(payload)["ports"]
            if not isinstance(ports, list) or not 0 < len(ports) <= MAX_PORTS:
                raise ValueError
            ports = list(dict.fromkeys(int(p) for p in ports if isinstance(p, int) and 0 < p < 65536))
            if not ports:
                raise ValueError
        except (ValueError, KeyError, TypeError):
            return {"error": f"the request must be {{'ports': [1 to {MAX_PORTS} TCP ports]}}"}
        hosts = list(
            dict.fromkeys(h for m in await self.endpoint.connections_of(sender) if (h := _host_of(m)))
        )
        hosts = hosts[:MAX_HOSTS]
        if not hosts:
            return {"error": "no direct connection from the caller to dial back along"}
        if self._in_flight >= MAX_IN_FLIGHT:
            return {"error": "busy: too many dial-backs in flight, ask again later"}
        if self._per_peer.full(sender) or any(self._per_ip.full(h) for h in hosts):
            return {
                "error": f"too many dial-back requests: at most {CALLS_PER_PEER} a minute per peer, {CALLS_PER_IP} per address"
            }
        self._per_peer.take(sender)
        for h in hosts:
            self._per_ip.take(h)
        self._in_flight += 1
        try:
            targets = [(h, p) for h in hosts for p in ports]
            outcomes = await asyncio.gather(*(dial(h, p) for h, p in targets))
        finally:
            self._in_flight -= 1
        return {
            "seen_from": hosts,
            "dialed": [{"host": h, "port": p, "outcome": o} for (h, p), o in zip(targets, outcomes)],
        }


def serve_dial_back(endpoint: Endpoint) -> DialBackService:
    """Start answering dial-back requests on ``endpoint`` (until the endpoint closes)."""
    return DialBackService(endpoint).serve()


class DialBackRefused(RuntimeError):
    """The node answered the request with an error (rate limit, no direct connection, busy)."""


def ask_dial_back(
    endpoint: Endpoint, peer_id: str, ports: list[int], timeout: float = CALL_SECONDS
) -> DialBack:
    """Ask node ``peer_id`` to dial this node's ``ports`` back (within ``timeout`` s). Raises
    DialBackRefused if it answers with an error, TimeoutError or another error if it does not answer
    (a node that does not serve dial-back fails at once)."""
    raw = endpoint.call(
        peer_id, DIAL_BACK_HANDLER, json.dumps({"ports": ports[:MAX_PORTS]}).encode(), timeout
    )
    reply = json.loads(raw)
    if "error" in reply:
        raise DialBackRefused(str(reply["error"]))
    dialed = tuple(Dial(str(d["host"]), int(d["port"]), str(d["outcome"])) for d in reply["dialed"])
    return DialBack(peer_id, tuple(str(h) for h in reply["seen_from"]), dialed)
