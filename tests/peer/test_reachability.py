"""What a peer makes of a dial-back: the one line it says (what was found, what to change), and, over
real libp2p on 127.0.0.1, a node found reachable by a swarm node that dials back, and reachability
left unknown (the node stays a server) when its initial peer does not serve dial-back; and
`manta-peer check` without a swarm: one line, exit 1, no file. The unreachable case runs on the emulated internet's NAT site (test_reachability_wan.py)."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import time

import pytest

from hivemind_adapter.dht import start_dht, visible_maddrs
from hivemind_adapter.dial_back import REACHABLE, Dial, DialBack, serve_dial_back
from hivemind_adapter.p2p import Endpoint
from peer.reachability import Reachability, describe, initial_peer_ids, probe, start_peer_dht
from tests.helpers import console_script

LOOPBACK = ["/ip4/127.0.0.1/tcp/0"]
NODE = "QmXrsSewa7KGAr1YLSsuEx12NAi8zGPc59pctU3H2Ench7"


def _unreachable(outcome: str, announced=("127.0.0.1:40123", "192.168.1.2:40123")) -> Reachability:
    found = DialBack(NODE, ("203.0.113.9",), (Dial("203.0.113.9", 40123, outcome),))
    return Reachability("unreachable", announced, found)


def test_an_unreachable_peer_is_told_where_it_was_seen_and_what_to_forward_and_pass():
    line = describe(_unreachable("no answer"), "0.0.0.0:0")
    assert line == (
        "the swarm cannot connect to this peer: node …3H2Ench7 sees it at 203.0.113.9 and found no peer at "
        "TCP port 40123 there (no answer); it runs in client mode (it connects out and trains, but serves "
        "only peers on its own LAN). To serve the swarm, forward TCP port 40123 of your router to this "
        "machine and pass --listen 0.0.0.0:40123 --announce 203.0.113.9:40123"
    )
    assert "\n" not in line
    # a fixed --listen port is the one to forward
    assert describe(_unreachable("refused"), "0.0.0.0:4001").endswith(
        "forward TCP port 4001 of your router to this machine and pass --listen 0.0.0.0:4001 "
        "--announce 203.0.113.9:4001"
    )


def test_a_peer_reached_at_an_address_it_does_not_announce_is_told_to_announce_it():
    line = describe(_unreachable(REACHABLE), "0.0.0.0:0")
    assert line.startswith(
        "node …3H2Ench7 reached this peer at 203.0.113.9:40123, which it does not announce"
    )
    assert line.endswith("pass --listen 0.0.0.0:40123 --announce 203.0.113.9:40123")
    assert "client mode" in line


def test_initial_peer_ids_are_each_asked_once_in_order():
    peers = [
        f"/ip4/10.0.0.2/tcp/1/p2p/{NODE}",
        "/ip4/10.0.0.3/tcp/1/p2p/QmOther",
        f"/ip4/127.0.0.1/tcp/1/p2p/{NODE}",
    ]
    assert initial_peer_ids(peers) == [NODE, "QmOther"]


@pytest.fixture
def swarm_node():
    """A node of the swarm that serves dial-back, and its multiaddrs."""
    dht = start_dht(host_maddrs=LOOPBACK)
    endpoint = Endpoint(dht, "swarm-node")
    try:
        serve_dial_back(endpoint)
        yield visible_maddrs(dht)
    finally:
        endpoint.close()
        dht.shutdown()


def test_a_node_on_loopback_is_found_reachable_by_a_swarm_node(swarm_node):
    dht = start_dht(host_maddrs=LOOPBACK, initial_peers=swarm_node, client_mode=True)
    endpoint = Endpoint(dht, "joiner")
    try:
        reach = probe(dht, endpoint, swarm_node)
        own = visible_maddrs(dht)[0].split("/")
    finally:
        endpoint.close()
        dht.shutdown()
    assert reach.verdict == "reachable", reach
    assert reach.reachable_at() == [f"127.0.0.1:{own[4]}"]
    assert reach.as_json()["seen_from"] == ["127.0.0.1"]
    assert describe(reach, "127.0.0.1:0") == (
        f"reachable: node …{swarm_node[0].split('/')[-1][-8:]} connected to this peer at 127.0.0.1:{own[4]}"
    )


def test_without_a_dial_back_service_a_joining_node_stays_a_server_and_says_why_at_debug(caplog):
    old = start_dht(host_maddrs=LOOPBACK)  # a swarm node from before dial-back: it does not serve it
    try:
        with caplog.at_level(logging.DEBUG, logger="manta.peer"):
            dht, client_mode = start_peer_dht(visible_maddrs(old), "127.0.0.1:0", (), False, None)
        dht.shutdown()
    finally:
        old.shutdown()
    assert client_mode is False
    said = [r for r in caplog.records if r.name == "manta.peer"]
    assert [r.levelno for r in said] == [logging.DEBUG], [r.getMessage() for r in said]
    assert said[0].getMessage().startswith("reachability unknown: …")
    assert said[0].getMessage().endswith("does not dial back (P2PDaemonError); it stays a server")


def test_check_exits_with_one_line_when_no_initial_peer_answers_and_writes_no_file(tmp_path):
    with socket.socket() as s:  # a local port with nothing listening on it
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    peer = f"/ip4/127.0.0.1/tcp/{port}/p2p/{NODE}"
    started = time.monotonic()
    done = subprocess.run(
        [console_script("manta-peer"), "check", "--initial-peers", peer, "--gpus", "none"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, env=dict(os.environ, HOME=str(tmp_path)),
    )  # fmt: skip
    assert done.returncode == 1, done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("Error:")]
    assert errors == [f"Error: cannot reach the swarm: cannot reach any initial peer ({peer})"], done.stderr
    assert "Traceback" not in done.stderr
    sections = [line.split("  ")[0] for line in done.stdout.splitlines()]
    assert sections == ["devices", "memory", "disk", "initial peers", "task", "reachability"], done.stdout
    assert "initial peers  0 of 1 answered" in done.stdout
    assert list(tmp_path.iterdir()) == []  # a preflight: no identity, no data dir
    assert time.monotonic() - started < 90
