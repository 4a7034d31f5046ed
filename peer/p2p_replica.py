"""A libp2p client of a DHT's daemon that belongs to the calling event loop.

``hivemind.DHT.replicate_p2p()`` caches one replica per process, bound to the event loop that first
asked for it: a second component with its own :class:`~protocol.aio.BackgroundLoop` that reuses it
waits forever (its coroutines need the first loop). :func:`own_replica` gives each component its own
client of the same daemon (same peer id), created on the loop it is awaited on. Close it with
``await p2p.shutdown()`` (for a replica that closes the client; the daemon keeps running).

A peer needs this (its receipt courier and its search service each run their own loop); a process
with a single p2p component, like ``manta-aggregator search``, can use ``dht.replicate_p2p()``.
"""

from __future__ import annotations

from typing import Any


async def _daemon_address(_dht: Any, node: Any) -> Any:  # runs inside the DHT process
    return node.p2p.daemon_listen_maddr


async def own_replica(dht: Any) -> Any:
    """A new ``hivemind.p2p.P2P`` client of ``dht``'s daemon on the running loop."""
    from hivemind.p2p import P2P

    return await P2P.replicate(dht.run_coroutine(_daemon_address))
