"""The signed commit board on a real hivemind DHT: a departure notice makes the peers that expect the
leaver abandon its attempt, without moving the swarm's attempt counter (which would make them skip
past the notice and wait for the leaver until their step timeout, as they did before: 62 s)."""

from __future__ import annotations

import pytest

from hivemind_adapter.dht import peer_id, start_dht, visible_maddrs
from peer.swarm_view import SignedCommitBoard
from protocol.dht_schema import MantaRecordValidator
from protocol.identity import Identity

LOOPBACK = ["/ip4/127.0.0.1/tcp/0"]
TASK = "digits-board-test"


@pytest.fixture
def two_boards():
    first = start_dht(host_maddrs=LOOPBACK)
    second = start_dht(host_maddrs=LOOPBACK, initial_peers=visible_maddrs(first))
    try:
        for dht in (first, second):
            dht.add_validators([MantaRecordValidator(TASK)])
        yield [SignedCommitBoard(d, TASK, Identity.generate(), peer_id(d)) for d in (first, second)]
    finally:
        second.shutdown()
        first.shutdown()


def test_a_departure_notice_fails_its_attempt_but_does_not_count_as_one(two_boards):
    stayer, leaver = two_boards
    digest = "ab" * 32
    stayer.post(3, True, digest)
    leaver.post(3, True, digest)
    leaver.post(4, False, "", left=True)  # the leaver's next attempt: it will not be there

    assert stayer.latest_attempt() == 3  # so the stayer's next attempt is 4, the one the notice names
    reports = stayer.read(4)
    assert reports == {leaver.peer_id: {"ok": False, "digest": ""}}
    # an attempt someone actually ran (and failed) does move the counter
    leaver.post(4, False, "")
    assert stayer.latest_attempt() == 4
