"""A state archive serving on one loopback DHT node and a client endpoint on another (the tests that
fetch states from a holder)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from hivemind_adapter.dht import start_dht, visible_maddrs
from hivemind_adapter.p2p import Endpoint
from hivemind_adapter.state_archive import StateArchive

LOOPBACK = ["/ip4/127.0.0.1/tcp/0"]


@contextmanager
def archive_and_client(
    task_id: str, keep: int = 2, head: int = 1
) -> Iterator[tuple[StateArchive, str, Endpoint]]:
    """``(archive, the archive's peer id, client)``; everything is closed on exit."""
    server_dht = start_dht(host_maddrs=LOOPBACK)
    client_dht = start_dht(host_maddrs=LOOPBACK, initial_peers=visible_maddrs(server_dht))
    server, client = Endpoint(server_dht, "server"), Endpoint(client_dht, "client")
    archive = StateArchive(server, task_id, head=head, keep=keep)
    try:
        yield archive, server.peer_id, client
    finally:
        archive.close()
        client.close()
        server.close()
        client_dht.shutdown()
        server_dht.shutdown()
