"""Real libp2p daemons on 127.0.0.1 for the certificate tests: a DHT, an endpoint and a MANTA key per
node, every node bootstrapped from the first."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from hivemind_adapter.dht import start_dht, visible_maddrs
from hivemind_adapter.p2p import Endpoint
from protocol.identity import Identity

LOOPBACK = ["/ip4/127.0.0.1/tcp/0"]


@dataclass(frozen=True)
class Nodes:
    dhts: list
    endpoints: list[Endpoint]
    identities: list[Identity]

    @property
    def peers(self) -> list[str]:
        return [e.peer_id for e in self.endpoints]


@contextmanager
def real_nodes(count: int, name: str) -> Iterator[Nodes]:
    """``count`` nodes, their keys seeded by index; each stopped on the way out."""
    dhts = [start_dht(host_maddrs=LOOPBACK)]
    try:
        dhts += [
            start_dht(host_maddrs=LOOPBACK, initial_peers=visible_maddrs(dhts[0])) for _ in range(count - 1)
        ]
        endpoints = [Endpoint(dht, f"{name}-{i}") for i, dht in enumerate(dhts)]
        identities = [Identity.from_seed(hashlib.sha256(f"node {i}".encode()).digest()) for i in range(count)]
        try:
            yield Nodes(dhts, endpoints, identities)
        finally:
            for endpoint in endpoints:
                endpoint.close()
    finally:
        for dht in dhts:
            dht.shutdown()
