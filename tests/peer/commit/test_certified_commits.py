"""Rounds decided by commit certificates (:class:`peer.commit.certified.CertifiedCommitter`) on five
real libp2p daemons: posted results commit once their votes are a majority, departures leave the
majority, a failed peer settles on the decision, aborts decide an attempt without waiting out the
commit wait, and the attempt counter follows only valid votes of two or more of the roster's peers."""

from __future__ import annotations

import hashlib
import random
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from hivemind_adapter.dht import speaker
from peer.averaging.factory import committer_for
from peer.averaging.stage import AveragingTimeouts
from peer.commit.boards import SignedCommitBoard
from peer.commit.certificate_channel import CertificateChannel, encode, handler_name
from peer.commit.certificate_relay import Kind, RelayMessage, RelaySettings
from peer.commit.certified import SILENT_STRIKES, CertificateVotes, CertifiedCommitter
from peer.commit.report import CommitReport
from protocol.commit_certificate import ABORTED, DEPARTED, CommitCertificate, sign_vote
from protocol.identity import Identity
from tests.peer.commit.daemons import Nodes, real_nodes

TASK = "certified-commits-test"
RESULT = hashlib.sha256(b"the result").hexdigest()
GROUP = hashlib.sha256(b"the group").hexdigest()
SETTINGS = RelaySettings(cohort_wait=0.3, level_wait=0.5, gossip_after=3.0, gossip_every=0.5)
TIMEOUTS = AveragingTimeouts(commit=30.0)  # a wait that ends sooner ended on a decision


@contextmanager
def certified_swarm(
    name: str,
) -> Iterator[tuple[list[CertifiedCommitter], list[Identity], list[str], list, Nodes]]:
    """Five real nodes, each with a certificate channel and a certified committer; cohorts of 3 and 2."""
    with real_nodes(5, name) as five:
        peers, identities = five.peers, five.identities
        keys = {p: i.public_key_hex for p, i in zip(peers, identities)}
        channels = [
            CertificateChannel(e, TASK, SETTINGS, random.Random(n)) for n, e in enumerate(five.endpoints)
        ]
        committers = [
            committer_for(
                SignedCommitBoard(dht, TASK, speaker(dht, identity)),
                TIMEOUTS,
                certificates=CertificateVotes(channel, identity, lambda: keys),
            )  # fmt: skip
            for dht, identity, channel in zip(five.dhts, identities, channels)
        ]
        assert all(isinstance(c, CertifiedCommitter) for c in committers)
        cohorts = [peers[:3], peers[3:]]  # ranks 0 (3 peers) and 1 (2 peers)
        try:
            yield committers, identities, peers, cohorts, five
        finally:
            for channel in channels:
                channel.close()


@pytest.fixture(scope="module")
def swarm():
    with certified_swarm("certified") as (committers, identities, peers, cohorts, _):
        yield committers, identities, peers, cohorts


def _post(committer: CertifiedCommitter, attempt: int, ok: bool) -> None:
    report = CommitReport(ok=True, digest=RESULT, group=GROUP) if ok else CommitReport(ok=False)
    committer.post_result(attempt, report)


def test_results_commit_on_certificates_and_a_failed_peer_settles_on_them(swarm):
    committers, _, peers, cohorts = swarm
    for c in committers:
        c.open_attempt(1, peers, cohorts)
    for n, c in enumerate(committers):
        _post(c, 1, ok=n != 4)  # node 4 failed: 4 of 5 votes for the result
    decisions = [
        c.await_quorum(1, RESULT, peers, extra_seconds=0, witnesses=(), public_keys=None)
        for c in committers[:4]
    ]
    assert [d.committed for d in decisions] == [True] * 4, [d.reason for d in decisions]
    assert committers[4].settle(1, peers)
    assert committers[4].channel.wait_decided(1, 0) == RESULT
    assert not committers[4].quorum_now(1, peers, hashlib.sha256(b"its own").hexdigest(), None)
    assert [c.next_attempt(1) for c in committers] == [2] * 5
    assert committers[0].live_peers(1) == set(peers)


def test_aborts_decide_an_attempt_without_waiting_out_the_commit_wait(swarm):
    committers, _, peers, cohorts = swarm
    for c in committers:
        c.open_attempt(2, peers, cohorts)
    for n, c in enumerate(committers):
        _post(c, 2, ok=n in (0, 3))  # 2 of 5 for the result, 3 failures: none can reach 3
    started = time.monotonic()
    decision = committers[0].await_quorum(2, RESULT, peers, extra_seconds=0, witnesses=(), public_keys=None)
    assert not decision.committed and not decision.timed_out, decision.reason
    assert "no result can reach a majority" in decision.reason
    assert time.monotonic() - started < TIMEOUTS.commit
    assert committers[2].settle(2, peers) and committers[2].channel.wait_decided(2, 0) == ABORTED


def test_the_attempt_counter_follows_two_or_more_roster_voters_only(swarm):
    committers, identities, peers, cohorts = swarm
    for c in committers:
        c.open_attempt(3, peers, cohorts)
    me = committers[0]
    stranger = Identity.from_seed(hashlib.sha256(b"a throw-away key").digest())

    def later_vote(identity: Identity, voter: str, attempt: int) -> bytes:
        signature = sign_vote(identity, TASK, attempt, RESULT, GROUP)
        certificate = CommitCertificate(TASK, attempt, "c0000", RESULT, GROUP, {voter: signature})
        return encode(attempt, RelayMessage(Kind.VOTE, (certificate.to_wire(),)))

    sender = committers[1].channel.endpoint
    # a vote for attempt 50 under peer 1's name but a key the roster does not hold: ignored
    sender.call(peers[0], handler_name(TASK), later_vote(stranger, peers[1], 50), timeout=10)
    assert me.next_attempt(3) == 4
    # peer 2's own vote in attempt 7: one witness is not enough (one key could name any attempt)
    sender.call(peers[0], handler_name(TASK), later_vote(identities[2], peers[2], 7), timeout=10)
    assert me.next_attempt(3) == 4
    # peer 3's in attempt 7 too: the swarm ended attempt 7, so this peer takes part in 8
    sender.call(peers[0], handler_name(TASK), later_vote(identities[3], peers[3], 7), timeout=10)
    assert me.next_attempt(3) == 8
    # one message down the tree carries the votes of two roster peers in attempt 12: that is two witnesses
    both = {peers[n]: sign_vote(identities[n], TASK, 12, RESULT, GROUP) for n in (1, 4)}
    down = CommitCertificate(TASK, 12, "c0000", RESULT, GROUP, both)
    message = encode(12, RelayMessage(Kind.DOWN, (down.to_wire(),)))
    sender.call(peers[0], handler_name(TASK), message, timeout=10)
    assert me.next_attempt(3) == 13
    # peer 1's own valid vote in attempt 1000: alone, it moves nothing
    sender.call(peers[0], handler_name(TASK), later_vote(identities[1], peers[1], 1000), timeout=10)
    assert me.next_attempt(3) == 13


def test_peers_that_depart_leave_the_majority_and_a_result_commits_on_the_rest(swarm):
    committers, _, peers, cohorts = swarm
    for c in committers:
        c.open_attempt(10, peers, cohorts)
    committers[2].leave(10)
    committers[3].leave(10)
    for c in committers[:2]:
        _post(c, 10, ok=True)  # 2 votes of the 3 peers that did not depart; node 4 stays silent
    decision = committers[0].await_quorum(10, RESULT, peers, extra_seconds=0, witnesses=(), public_keys=None)
    assert decision.committed, decision.reason
    assert committers[4].channel.wait_decided(10, 20) == RESULT
    assert committers[1].reports.read(10)[peers[2]].left  # the stages see a departure, not a failure


def test_a_key_that_votes_twice_is_named_and_counts_nowhere(swarm, caplog):
    committers, identities, peers, cohorts = swarm
    for c in committers:
        c.open_attempt(11, peers, cohorts)
    sender = committers[4].channel.endpoint
    for digest, group in ((RESULT, GROUP), (DEPARTED, "")):  # node 4's key: a result, then a departure
        vote = {peers[4]: sign_vote(identities[4], TASK, 11, digest, group)}
        wire = CommitCertificate(TASK, 11, "c0001", digest, group, vote).to_wire()
        sender.call(peers[0], handler_name(TASK), encode(11, RelayMessage(Kind.VOTE, (wire,))), timeout=10)
    for c in committers[:3]:
        _post(c, 11, ok=True)
    with caplog.at_level("WARNING", logger="peer.commit.certified"):
        decision = committers[0].await_quorum(
            11, RESULT, peers, extra_seconds=0, witnesses=(), public_keys=None
        )
    assert decision.committed, decision.reason  # 3 of 5: node 4 counts in neither the result nor the base
    assert [e.peer_id for e in committers[0].channel.equivocations(11)] == [peers[4]]
    assert f"peer {peers[4][-8:]} voted for" in caplog.text
    hearing = committers[0].channel.hearing(11)
    assert hearing is not None and hearing.roster == 5 and hearing.voters >= 4 and hearing.votes_refused == 0
    assert committers[0].channel.hearing(999) is None  # not open here


def test_an_undecided_wait_ends_once_every_peer_still_to_vote_stops_answering(caplog):
    # Node 4 is killed (its DHT and daemon stopped) before it votes: 2 votes for the result and 2
    # failures leave the attempt undecided while it counts as unheard (2 + 1 could still be a majority
    # of 5). Once it failed three direct probes in a row the wait ends, long before the commit wait,
    # decides nothing, and read no roster (the committers have no roster reader).
    with certified_swarm("certified-kill") as (committers, _, peers, cohorts, five):
        assert all(c.online is None for c in committers)
        for c in committers:
            c.open_attempt(17, peers, cohorts)
        five.endpoints[4].close()
        five.dhts[4].shutdown()
        for n in range(4):
            _post(committers[n], 17, ok=n in (0, 1))
        waiting = committers[0]
        started = time.monotonic()
        with caplog.at_level("INFO", logger="peer.commit.certified"):
            decision = waiting.await_quorum(
                17, RESULT, peers, extra_seconds=0, witnesses=(), public_keys=None
            )
        waited = time.monotonic() - started
        assert not decision.committed and decision.timed_out, decision.reason
        assert "the 1 peer(s) not heard from do not answer" in decision.reason
        # its log says how the votes it heard split
        undecided = [r.getMessage() for r in caplog.records if "undecided after" in r.getMessage()]
        assert len(undecided) == 1 and "4 of 5 voted as heard here (" in undecided[0], undecided
        split = undecided[0].split("heard here (")[1].split(")")[0].split(", ")
        assert sorted(split) == sorted([f"{RESULT[:8]}: 2", "aborted: 2"]), undecided
        assert waited < TIMEOUTS.commit / 3, waited
        assert waiting.channel.wait_decided(17, 0) is None  # nothing was decided


def test_a_probe_counts_a_peer_that_answers_as_there(swarm):
    # Every peer of the module's swarm is alive: a probe hears them all, and however often an
    # undecided wait probes, nobody counts as gone.
    committers, _, peers, cohorts = swarm
    committers[0].open_attempt(18, peers, cohorts)
    answers = committers[0].channel.probe(18, peers[1:])
    assert answers.answered == set(peers[1:]) and not answers.silent
    for _ in range(SILENT_STRIKES + 1):
        assert committers[0].never_reporting(18, peers) == set()


def test_a_peer_that_skips_past_attempts_the_swarm_ran_votes_departed_in_them(swarm):
    # Node 0 was still waiting on attempt 40 while the others ran 42: two of its cohort mates' votes
    # move its counter to 43. Its departure votes in 41 and 42 let the others decide 42 (2 for the
    # result, 2 failures, 1 departed: none can reach 3 of 4) instead of waiting out the commit wait
    # for a vote that would never come.
    committers, _, peers, cohorts = swarm
    behind = committers[0]
    behind.open_attempt(40, peers, cohorts)
    behind.attempt = 40
    for c in committers[1:]:
        c.open_attempt(42, peers, cohorts)
    for n in (1, 2, 3, 4):
        _post(committers[n], 42, ok=n in (1, 2))
    deadline = time.monotonic() + 10
    while behind.channel.latest_attempt() < 42 and time.monotonic() < deadline:
        time.sleep(0.1)
    started = time.monotonic()
    assert behind.advance() == 43
    assert committers[1].settle(42, peers)
    assert time.monotonic() - started < TIMEOUTS.commit / 3
    assert committers[1].channel.wait_decided(42, 0) == ABORTED
    assert committers[1].channel.votes(42)[peers[0]] == (DEPARTED, "")
    assert set(behind.channel.votes(41)) == {peers[0]}  # it departed 41 too (nobody else ran it)
