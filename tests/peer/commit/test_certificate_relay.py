"""Spreading commit certificates: every live peer commits over the in-process transport, with a
constant number of messages per peer as the swarm grows, gossip stands in for a dead root, and
certificates that do not check out are refused."""

from __future__ import annotations

import hashlib
import random
import statistics
from dataclasses import replace

from benchmarks.coordination_sim import ATTEMPT, GROUP, RESULT, TASK, SimConfig, make_swarm, simulate
from peer.commit.certificate_relay import CertificateRelay, Kind, RelayMessage, RelayPlan, RelaySettings
from protocol.commit_certificate import CommitCertificate, sign_vote


def test_every_peer_commits_and_sends_as_many_messages_at_240_peers_as_at_60():
    small, large = simulate(SimConfig(peers=60)), simulate(SimConfig(peers=240))
    for result in (small, large):
        assert result.committed == result.live_voters == result.config.peers
        assert result.wrong_results == 0
    messages = [
        statistics.median(m + n for m, n in zip(r.sent_messages, r.received_messages)) for r in (small, large)
    ]
    assert messages[1] <= messages[0] + 1, messages
    assert statistics.median(large.sent_bytes) <= 1.2 * statistics.median(small.sent_bytes)


def test_the_second_leader_sends_the_certificates_down_when_the_first_dies_before_it_could():
    result = simulate(SimConfig(peers=64, root_dies_at=0.25, settings=RelaySettings(gossip_after=1e9)))
    assert result.committed == result.live_voters == 63 and result.wrong_results == 0
    alone = simulate(
        SimConfig(peers=64, root_dies_at=0.25, settings=RelaySettings(gossip_after=1e9, leaders=1))
    )
    assert alone.committed < alone.live_voters


def test_gossip_brings_the_certificates_when_both_leaders_of_the_root_die_before_sending_them_down():
    config = SimConfig(peers=64, root_dies_at=0.25, root_leaders_dying=2, time_limit=30.0)
    repaired = simulate(config)
    assert repaired.committed == repaired.live_voters == 62
    assert repaired.wrong_results == 0
    without_gossip = simulate(replace(config, settings=RelaySettings(gossip_after=1e9)))
    assert without_gossip.committed < without_gossip.live_voters


def test_a_root_with_no_result_of_its_own_still_passes_the_certificates_down():
    result = simulate(SimConfig(peers=64, root_votes=False, settings=RelaySettings(gossip_after=1e9)))
    assert result.live_voters == 63 and result.committed == 63


def test_votes_that_come_seconds_after_their_cohorts_first_still_reach_every_peer():
    # members end their averaging seconds apart: votes after a hop's first pass follow it
    result = simulate(SimConfig(peers=64, vote_spread=4.0, settings=RelaySettings(gossip_after=1e9)))
    assert result.committed == result.live_voters == 64


def test_late_votes_go_in_batches_so_a_peer_gets_a_few_more_messages_per_tree_level_not_per_peer():
    # 80 peers: 20 cohorts under 2 tree levels; 320 peers: 80 cohorts under 3 (groups of 8)
    small, large = (simulate(SimConfig(peers=n, vote_spread=3.0)) for n in (80, 320))
    assert small.committed == 80 and large.committed == 320
    messages = [
        statistics.median(m + n for m, n in zip(r.sent_messages, r.received_messages)) for r in (small, large)
    ]
    assert messages[1] <= messages[0] + 3, messages  # 13 and 16 (without batching: 46)


def test_churn_leaves_every_live_peer_committed():
    result = simulate(SimConfig(peers=120, churn=0.1, seed=3))
    assert result.live_voters < 120
    assert result.committed == result.live_voters and result.wrong_results == 0


def test_a_certificate_that_does_not_check_out_is_refused_and_commits_nothing():
    identities, roster = make_swarm(12, 4, seed=5)
    peers = sorted(identities)
    me, liar = peers[0], peers[1]
    relay = CertificateRelay(me, TASK, ATTEMPT, roster, RelaySettings(), random.Random(0))
    other = hashlib.sha256(b"a result nobody computed").hexdigest()
    forged = {}  # the liar signs every vote of the other cohorts in their members' names
    for cohort in {roster.cohorts[p] for p in peers} - {roster.cohorts[me]}:
        votes = {
            p: sign_vote(identities[liar], TASK, ATTEMPT, other, GROUP) for p in roster.members_of(cohort)
        }
        forged[cohort] = CommitCertificate(TASK, ATTEMPT, cohort, other, GROUP, votes)
    relay.receive(1.0, liar, RelayMessage(Kind.PUSH, tuple(c.to_wire() for c in forged.values())))
    # only the liar's vote in its own name checks out: every vote it forged is left out
    forged_votes = sum(len(c.votes) for c in forged.values())
    assert relay.tally.votes_refused == forged_votes - 1 and relay.tally.voters() == {liar}
    assert relay.refused == len(forged) - 1 and relay.committed is None
    own = {
        p: sign_vote(identities[p], TASK, ATTEMPT, RESULT, GROUP)
        for p in roster.members_of(roster.cohorts[me])
    }
    relay.receive(1.1, liar, RelayMessage(Kind.PUSH, (b"not a certificate",)))
    assert relay.refused == len(forged)  # one more: the bytes that are no certificate
    relay.vote(1.2, CommitCertificate(TASK, ATTEMPT, roster.cohorts[me], RESULT, GROUP, {me: own[me]}))
    assert relay.committed is None  # 1 vote of 12


def test_a_peer_in_an_attempt_that_never_commits_asks_around_a_bounded_number_of_times():
    identities, roster = make_swarm(12, 4, seed=7)
    me = sorted(identities)[5]
    settings = RelaySettings(
        gossip_after=1.0, gossip_every=0.5, gossip_peers=2, gossip_times=4, gossip_for=9.0
    )
    relay = CertificateRelay(me, TASK, ATTEMPT, roster, settings, random.Random(1))
    vote = {me: sign_vote(identities[me], TASK, ATTEMPT, RESULT, GROUP)}
    sent = relay.vote(0.0, CommitCertificate(TASK, ATTEMPT, roster.cohorts[me], RESULT, GROUP, vote))
    now = 0.0
    while (due := relay.next_due()) is not None and due < 600:
        now = due
        sent += relay.tick(now)
    pulls = [out for out in sent if out.message.kind is Kind.PULL]
    # asks at 1, 1.5, 2, 2.5 s, then 1, 2 and 4 s apart: 3.5, 5.5, 9.5 (past gossip_for: not asked)
    assert relay.committed is None and len(pulls) == 2 * 6 and now == 5.5
    later = CertificateRelay(me, TASK, ATTEMPT, roster, settings, random.Random(1))
    later.vote(0.0, CommitCertificate(TASK, ATTEMPT, roster.cohorts[me], RESULT, GROUP, vote))
    later.stop_gossip()
    assert not [out for out in later.tick(5.0) if out.message.kind is Kind.PULL]


def test_a_peer_waiting_past_its_gossip_keeps_asking_until_its_wait_ends_and_hears_the_decision():
    identities, roster = make_swarm(12, 4, seed=7)
    peers = sorted(identities)
    me = peers[5]
    settings = RelaySettings(
        gossip_after=1.0,
        gossip_every=0.5,
        gossip_peers=2,
        gossip_times=4,
        gossip_most_every=3.0,
        gossip_for=9.0,
    )
    relay = CertificateRelay(me, TASK, ATTEMPT, roster, settings, random.Random(1))
    vote = {me: sign_vote(identities[me], TASK, ATTEMPT, RESULT, GROUP)}
    relay.vote(0.0, CommitCertificate(TASK, ATTEMPT, roster.cohorts[me], RESULT, GROUP, vote))
    while (due := relay.next_due()) is not None and due < 600:
        relay.tick(due)
    assert relay.next_due() is None  # its own gossip is over, undecided
    relay.keep_asking(20.0, 40.0)  # it waits on the attempt until 40 s
    asked_at = []
    while (due := relay.next_due()) is not None and due < 600:
        if [out for out in relay.tick(due) if out.message.kind is Kind.PULL]:
            asked_at.append(due)
    # every 3 s at most (the doubled spacing is capped), from the call to the end of the wait
    assert (
        asked_at[0] == 20.0
        and asked_at[-1] > 37.0
        and max(b - a for a, b in zip(asked_at, asked_at[1:])) <= 3.0
    )
    relay.keep_asking(41.0, 60.0)
    relay.tick(41.0)
    majority = {p: sign_vote(identities[p], TASK, ATTEMPT, RESULT, GROUP) for p in peers[:7]}
    answer = CommitCertificate(TASK, ATTEMPT, roster.cohorts[peers[0]], RESULT, GROUP, majority)
    relay.receive(42.0, peers[0], RelayMessage(Kind.PUSH, (answer.to_wire(),)))
    assert relay.committed == RESULT and relay.next_due() is None  # decided: no more asks
    relay.keep_asking(43.0, 90.0)
    assert relay.next_due() is None


def test_a_stranger_passing_votes_up_is_not_made_a_child_but_the_votes_it_carries_count():
    identities, roster = make_swarm(8, 4, seed=9)
    peers = sorted(identities)
    me = RelayPlan.of(roster).cohorts[0][0]  # the root: it takes ups
    relay = CertificateRelay(me, TASK, ATTEMPT, roster, RelaySettings(), random.Random(0))
    other = next(p for p in peers if roster.cohorts[p] != roster.cohorts[me])
    cohort = sorted(roster.members_of(roster.cohorts[other]))
    votes = {p: sign_vote(identities[p], TASK, ATTEMPT, RESULT, GROUP) for p in cohort}
    certificate = CommitCertificate(TASK, ATTEMPT, roster.cohorts[other], RESULT, GROUP, votes)
    stranger = "QmStrangerOutsideTheRosterxxxxxxxxxxxxxxxxxxxxxx"
    out = relay.receive(1.0, stranger, RelayMessage(Kind.UP, (certificate.to_wire(),), 1))
    assert stranger not in {o.to for o in out} and relay.tally.counted(RESULT) == set(cohort)
