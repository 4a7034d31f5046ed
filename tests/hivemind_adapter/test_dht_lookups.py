"""A lookup asks a bounded beam of nodes, not the whole swarm, and still finds every entry of a key
stored from many nodes."""

from __future__ import annotations

from hivemind_adapter.control_traffic import control_traffic
from hivemind_adapter.dht import DHT_BUCKET_SIZE, read_entries, start_dht, store, visible_maddrs

NODES = 12
LOOPBACK = ["/ip4/127.0.0.1/tcp/0"]


def test_a_read_in_a_swarm_of_twelve_asks_a_beam_of_nodes_and_finds_every_entry():
    first = start_dht(host_maddrs=LOOPBACK)
    nodes = [first]
    try:
        for _ in range(NODES - 1):  # one at a time: asyncio spawns one daemon at a time per process
            nodes.append(start_dht(host_maddrs=LOOPBACK, initial_peers=visible_maddrs(first)))
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
    finally:
        for node in reversed(nodes):
            node.shutdown()
