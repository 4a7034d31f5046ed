"""Commit certificates over real libp2p daemons on 127.0.0.1: five nodes in two cohorts commit on
the votes of four (the fifth learns the result without voting), a node that opens its attempt after
its partners voted still commits, and bytes that are not a message are refused."""

from __future__ import annotations

import hashlib
import random
import time

import pytest

from peer.commit.certificate_channel import CertificateChannel, decode, encode, handler_name
from peer.commit.certificate_relay import Kind, RelayMessage, RelaySettings
from protocol.commit_certificate import CommitCertificate, RosterSnapshot, sign_vote
from protocol.identity import Identity
from tests.peer.commit.daemons import real_nodes

TASK = "certificate-channel-test"
RESULT = hashlib.sha256(b"the result").hexdigest()
GROUP = hashlib.sha256(b"the group").hexdigest()
SETTINGS = RelaySettings(cohort_wait=0.3, level_wait=0.5, gossip_after=3.0, gossip_every=0.5)


@pytest.fixture(scope="module")
def nodes():
    with real_nodes(5, "certificates") as five:
        peers = five.peers
        roster = RosterSnapshot(
            {p: i.public_key_hex for p, i in zip(peers, five.identities)},
            {p: ("cohort-a" if n < 3 else "cohort-b") for n, p in enumerate(peers)},
        )
        channels = [
            CertificateChannel(e, TASK, SETTINGS, random.Random(n)) for n, e in enumerate(five.endpoints)
        ]
        try:
            yield channels, five.identities, roster
        finally:
            for channel in channels:
                channel.close()


def _vote(channel: CertificateChannel, identity: Identity, roster: RosterSnapshot, attempt: int) -> None:
    me = channel.endpoint.peer_id
    signature = sign_vote(identity, TASK, attempt, RESULT, GROUP)
    channel.vote(
        attempt, CommitCertificate(TASK, attempt, roster.cohorts[me], RESULT, GROUP, {me: signature})
    )


def test_four_votes_of_five_commit_every_node_over_direct_calls(nodes):
    channels, identities, roster = nodes
    for channel in channels:
        channel.open(1, roster)
    for n in (0, 1, 3, 4):  # node 2 (cohort a) never votes: 4 of 5
        _vote(channels[n], identities[n], roster, 1)
    assert [c.wait_committed(1, timeout=20) for c in channels] == [RESULT] * 5
    assert all(c.sent_messages > 0 for n, c in enumerate(channels) if n != 2)
    assert sum(c.lost_messages for c in channels) == 0


def test_a_node_that_opens_its_attempt_after_its_partners_voted_still_commits(nodes):
    channels, identities, roster = nodes
    for n in (0, 1, 2, 4):
        channels[n].open(2, roster)
        _vote(channels[n], identities[n], roster, 2)
    time.sleep(1.0)  # node 3's partner votes arrive before it opens attempt 2
    channels[3].open(2, roster)
    _vote(channels[3], identities[3], roster, 2)
    assert channels[3].wait_committed(2, timeout=20) == RESULT
    assert channels[0].wait_committed(2, timeout=20) == RESULT


def test_bytes_that_are_not_a_message_are_refused_with_no_reply(nodes):
    channels, _, _ = nodes
    before = channels[1].refused_messages
    reply = channels[0].endpoint.call(
        channels[1].endpoint.peer_id, handler_name(TASK), b"\x00garbage", timeout=10
    )
    assert reply == b"" and channels[1].refused_messages == before + 1
    attempt, message = decode(encode(5, RelayMessage(Kind.UP, (b"{}", b"[]"), 2)))
    assert (attempt, message.kind, message.certificates, message.level) == (5, Kind.UP, (b"{}", b"[]"), 2)
    with pytest.raises(ValueError, match="header"):
        decode(b'{"attempt":1,"kind":"shout","level":0}')


def test_a_node_the_others_rosters_leave_out_hears_the_decision_by_asking_them(nodes):
    # Churn gives peers different rosters: here nodes 1-4 count without node 0, so no certificate
    # is sent to it down their tree; its asks (gossip) must bring the votes.
    channels, identities, roster = nodes
    peers = list(roster.keys)
    without = RosterSnapshot(
        {p: roster.keys[p] for p in peers[1:]}, {p: roster.cohorts[p] for p in peers[1:]}
    )
    channels[0].open(5, roster)
    for n in range(1, 5):
        channels[n].open(5, without)
    for n in range(1, 5):
        _vote(channels[n], identities[n], without, 5)
    _vote(channels[0], identities[0], roster, 5)  # its own vote starts its gossip clock
    assert [c.wait_committed(5, timeout=20) for c in channels[1:]] == [RESULT] * 4
    assert channels[0].wait_committed(5, timeout=30) == RESULT
    hearing = channels[0].hearing(5)
    assert hearing is not None and hearing.gossip_asked >= 1 and hearing.answers >= 1, hearing
