"""Dial-back over real libp2p on 127.0.0.1: a node's own port is found to speak libp2p, a closed port
and a port that is not libp2p are told apart, only the address the caller connects from is dialled,
bad requests and callers over the rate limit get one error each, and every dial is bounded."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest

from hivemind_adapter.dht import start_dht, visible_maddrs
from hivemind_adapter.dial_back import (
    CALLS_PER_IP,
    CALLS_PER_PEER,
    REACHABLE,
    DialBackRefused,
    ask_dial_back,
    dial,
    serve_dial_back,
)
from hivemind_adapter.p2p import Endpoint
from protocol.handler_names import DIAL_BACK_HANDLER

LOOPBACK = ["/ip4/127.0.0.1/tcp/0"]


def _port(dht) -> int:
    return int(visible_maddrs(dht)[0].split("/")[4])


@pytest.fixture(scope="module")
def nodes():
    """A node serving dial-back, and two callers (each its own DHT node and daemon)."""
    server = start_dht(host_maddrs=LOOPBACK)
    callers = [start_dht(host_maddrs=LOOPBACK, initial_peers=visible_maddrs(server)) for _ in range(2)]
    endpoints = [Endpoint(d, f"dial-back-{i}") for i, d in enumerate([server, *callers])]
    try:
        serve_dial_back(endpoints[0])
        yield [server, *callers], endpoints
    finally:
        for endpoint in endpoints:
            endpoint.close()
        for dht in [*callers, server]:
            dht.shutdown()


class _Silent:
    """A TCP listener that accepts and sends nothing: open, but not libp2p."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.accepted: list[str] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, (host, _) = self.sock.accept()
            except OSError:
                return
            self.accepted.append(host)
            conn.close()

    def close(self) -> None:
        self.sock.close()


def _closed_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as s:
        return s.getsockname()[1]


def test_a_nodes_own_port_speaks_libp2p_and_other_ports_are_told_apart(nodes):
    dhts, endpoints = nodes
    server_id = endpoints[0].peer_id
    silent, closed = _Silent(), _closed_port()
    try:
        found = ask_dial_back(endpoints[1], server_id, [_port(dhts[1]), silent.port, closed])
    finally:
        silent.close()
    assert found.asked == server_id
    assert found.seen_from == ("127.0.0.1",)  # where the caller's connection comes from, nothing else
    outcomes = {d.port: d.outcome for d in found.dialed}
    assert outcomes == {_port(dhts[1]): REACHABLE, silent.port: "not libp2p", closed: "refused"}
    assert {d.host for d in found.dialed} == {"127.0.0.1"}
    assert [d.address for d in found.reachable()] == [f"127.0.0.1:{_port(dhts[1])}"]
    assert silent.accepted == ["127.0.0.1"]


@pytest.mark.parametrize(
    "payload",
    [b"not json", b"{}", b'{"ports": []}', b'{"ports": [1, 2, 3, 4, 5]}', b'{"ports": [0, 70000]}',
     b'{"ports": "22"}'],
)  # fmt: skip
def test_a_bad_request_is_one_error_and_dials_nothing(nodes, payload):
    _, endpoints = nodes
    reply = endpoints[2].call(endpoints[0].peer_id, DIAL_BACK_HANDLER, payload, timeout=10)
    assert reply.startswith(b'{"error": "the request must be'), reply


def test_a_caller_over_the_rate_limit_is_refused(nodes):
    dhts, endpoints = nodes
    caller, port = endpoints[2], _port(dhts[2])
    answers = []
    for _ in range(CALLS_PER_PEER + 1):
        try:
            answers.append(ask_dial_back(caller, endpoints[0].peer_id, [port]).reachable() != ())
        except DialBackRefused as e:
            answers.append(str(e))
    assert answers == [True] * CALLS_PER_PEER + [
        f"too many dial-back requests: at most {CALLS_PER_PEER} a minute per peer, {CALLS_PER_IP} per address"
    ]
    # another caller on the same IP (127.0.0.1) still has its own budget
    assert ask_dial_back(endpoints[1], endpoints[0].peer_id, [_port(dhts[1])]).reachable()


def test_a_node_that_does_not_serve_dial_back_fails_the_call_at_once(nodes):
    _, endpoints = nodes
    started = time.monotonic()
    with pytest.raises(Exception) as raised:
        ask_dial_back(endpoints[0], endpoints[1].peer_id, [1234], timeout=10)
    assert not isinstance(raised.value, (DialBackRefused, TimeoutError))
    assert time.monotonic() - started < 5


def test_a_port_that_opens_and_never_speaks_is_given_up_on_within_the_bound():
    with socket.create_server(("127.0.0.1", 0)) as never_accepts:  # the kernel completes the handshake
        started = time.monotonic()
        outcome = asyncio.run(dial("127.0.0.1", never_accepts.getsockname()[1], seconds=1.0))
    assert outcome == "not libp2p"
    assert 1.0 <= time.monotonic() - started < 2.0
