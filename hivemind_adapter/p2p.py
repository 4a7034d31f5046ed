"""Calls between nodes over libp2p: byte-in, byte-out handlers on the DHT node's daemon.

``hivemind.DHT.replicate_p2p()`` caches one client per process, bound to the event loop that first
asked for it: a second component with its own loop that reused it would wait forever (its
coroutines need the first loop). So every component that talks to other nodes (the receipt courier,
the search service, the state archive, the aggregator's desk) opens its own :class:`Endpoint`: a
client of the same daemon (same peer id) on a background loop of its own. Handlers and calls carry
plain bytes; what they mean is the caller's business (``protocol/``), and every call is bounded.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from google.protobuf.wrappers_pb2 import BytesValue
from hivemind.p2p import P2P, PeerID

from hivemind_adapter.dht import dht_gone
from hivemind_adapter.event_loop import BackgroundLoop

Handler = Callable[[bytes, str], Awaitable[bytes]]  # (payload, sender's peer id) -> reply


async def _daemon_address(_dht: Any, node: Any) -> Any:  # runs inside the DHT process
    return node.p2p.daemon_listen_maddr


async def own_replica(dht: Any) -> P2P:
    """A new client of ``dht``'s daemon on the running loop (close with ``await p2p.shutdown()``)."""
    return await P2P.replicate(dht.run_coroutine(_daemon_address))


class Endpoint:
    """A client of ``dht``'s daemon on a loop of its own. Once the DHT has ended (its daemon with it,
    or about to be stopped), closing it asks the daemon nothing: each question would wait out its bound."""

    def __init__(self, dht: Any, name: str):
        self._dht = dht
        self.loop = BackgroundLoop(name)
        self.p2p = self.loop.run(own_replica(dht), timeout=30)
        self.peer_id = dht.peer_id.to_base58()
        self._handlers: list[str] = []

    def call(self, peer_id: str, handler: str, payload: bytes, timeout: float) -> bytes:
        """``payload`` to ``handler`` on node ``peer_id``; its reply (TimeoutError after ``timeout`` s)."""
        return self.loop.run(self.acall(peer_id, handler, payload), timeout=timeout)

    async def acall(self, peer_id: str, handler: str, payload: bytes) -> bytes:
        reply = await self.p2p.call_protobuf_handler(
            PeerID.from_base58(peer_id), handler, BytesValue(value=payload), BytesValue
        )
        return reply.value

    async def connections_of(self, peer_id: str) -> list[str]:
        """The remote multiaddrs (``/ip4/HOST/tcp/PORT``) of the daemon's open connections to node
        ``peer_id``, from the daemon's own list: where that node's traffic really comes from."""
        return [
            str(addr)
            for info in await self.p2p.list_peers()
            if info.peer_id.to_base58() == peer_id
            for addr in info.addrs
        ]

    def serve(self, handler: str, fn: Handler) -> None:
        """Answer ``handler`` with ``await fn(payload, sender)`` (it must not block the loop)."""

        async def handle(request, context):
            return BytesValue(value=await fn(request.value, context.remote_id.to_base58()))

        self.loop.run(self.p2p.add_protobuf_handler(handler, handle, BytesValue), timeout=30)
        self._handlers.append(handler)

    def unserve(self, handler: str) -> None:
        self._unregister(handler)
        if handler in self._handlers:
            self._handlers.remove(handler)

    def _unregister(self, handler: str) -> None:
        if dht_gone(self._dht):
            return  # its daemon is gone or going: nothing to unregister
        try:
            self.loop.run(self.p2p.remove_protobuf_handler(handler), timeout=5)
        except Exception:  # the daemon is gone: nothing to unregister
            pass

    def close(self) -> None:
        """Stop answering, close the client; bounded (the daemon may already be gone)."""
        for handler in self._handlers:
            self._unregister(handler)
        self._handlers.clear()
        try:  # the replica's own client connection (not the daemon, which the DHT node owns)
            self.loop.run(self.p2p.shutdown(), timeout=5)
        except Exception:
            pass
        self.loop.stop()
