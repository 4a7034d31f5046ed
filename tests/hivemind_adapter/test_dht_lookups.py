"""A lookup asks a bounded beam of nodes, not the whole swarm, and still finds every entry of a key
stored from many nodes; a store's search for its nodes downloads none of the key's value."""

from __future__ import annotations

import pytest

from hivemind_adapter.control_traffic import control_traffic
from hivemind_adapter.dht import DHT_BUCKET_SIZE, read_entries, start_dht, store, visible_maddrs

NODES = 12
LOOPBACK = ["/ip4/127.0.0.1/tcp/0"]
ENTRY_BYTES = 4096


@pytest.fixture(scope="module")
def nodes():
    first = start_dht(host_maddrs=LOOPBACK)
    started = [first]
    try:
        for _ in range(NODES - 1):  # one at a time: asyncio spawns one daemon at a time per process
            started.append(start_dht(host_maddrs=LOOPBACK, initial_peers=visible_maddrs(first)))
        yield started
    finally:
        for node in reversed(started):
            node.shutdown()


def test_a_read_in_a_swarm_of_twelve_asks_a_beam_of_nodes_and_finds_every_entry(nodes):
    for i, node in enumerate(nodes):
        assert store(node, "lookup-beam", i, 60.0, subkey=f"node-{i}")
    for reader in (nodes[3], nodes[-1]):
        before = control_traffic()
        found = read_entries(reader, "lookup-beam")
        sent = control_traffic() - before
        asked = sent.messages / 2  # every node is in this process: each request and its reply
        assert found == {f"node-{i}": i for i in range(NODES)}
        # hivemind's default beam (20) asked all 11 others on every read (what made a read's bytes
        # grow with the swarm's square); a beam of 5 asks about that many, plus the one node a read
        # copies what it found to
        assert asked <= 2 * DHT_BUCKET_SIZE, asked


def test_a_store_into_a_large_dictionary_sends_its_entry_but_downloads_none_of_the_others(nodes):
    for i, node in enumerate(nodes):  # a roster-like key: one 4 KB entry per node, 48 KB in all
        assert store(node, "large-board", bytes([i]) * ENTRY_BYTES, 60.0, subkey=f"node-{i}")
    before = control_traffic()
    assert store(nodes[5], "large-board", b"\xff" * ENTRY_BYTES, 60.0, subkey="newcomer")
    sent = control_traffic() - before
    # the entry goes to its 5 replicas; each node its search asks replies with nodes only. Before,
    # each such reply carried the whole 48 KB dictionary (and the storing node checked every entry).
    assert sent.bytes < (DHT_BUCKET_SIZE + 2) * ENTRY_BYTES, sent
    found = read_entries(nodes[-1], "large-board")
    assert set(found) == {f"node-{i}" for i in range(NODES)} | {"newcomer"}
    assert found["newcomer"] == b"\xff" * ENTRY_BYTES
