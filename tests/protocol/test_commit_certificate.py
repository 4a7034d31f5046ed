"""Commit votes and certificates with real Ed25519 keys: a round commits once the votes for one
result are more than half of the roster less the departures seen, two verifiers never commit
different results, and forged, foreign, replayed or equivocating votes count for nothing."""

from __future__ import annotations

import hashlib
import random

import pytest

from protocol.commit_certificate import (
    ABORTED,
    DEPARTED,
    MAX_WIRE_BYTES,
    BadVote,
    CertificateTally,
    CommitCertificate,
    MalformedCertificate,
    RosterSnapshot,
    UnknownVoter,
    WrongAttempt,
    sign_vote,
)
from protocol.identity import Identity
from tests.protocol.factories import peer_id_of

TASK = "digits-ofa-test"
ATTEMPT = 7
RESULT = hashlib.sha256(b"the averaged state").hexdigest()
OTHER_RESULT = hashlib.sha256(b"another averaged state").hexdigest()
GROUP = hashlib.sha256(b"the averaging group").hexdigest()


def _swarm(cohort_sizes: list[int]) -> tuple[dict[str, Identity], RosterSnapshot]:
    identities: dict[str, Identity] = {}
    cohorts: dict[str, str] = {}
    for c, size in enumerate(cohort_sizes):
        for m in range(size):
            identity = Identity.from_seed(hashlib.sha256(f"peer {c}.{m}".encode()).digest())
            peer = peer_id_of(identity)
            identities[peer], cohorts[peer] = identity, f"cohort-{c}"
    keys = {peer: identity.public_key_hex for peer, identity in identities.items()}
    return identities, RosterSnapshot(keys, cohorts)


def _certificate(
    identities: dict[str, Identity], voters, scope: str, digest: str = RESULT, attempt: int = ATTEMPT
) -> CommitCertificate:
    votes = {peer: sign_vote(identities[peer], TASK, attempt, digest, GROUP) for peer in voters}
    return CommitCertificate(TASK, attempt, scope, digest, GROUP, votes)


def _members(roster: RosterSnapshot, scope: str) -> list[str]:
    return sorted(roster.members_of(scope))


def test_a_round_commits_once_its_voters_are_more_than_half_of_the_roster():
    identities, roster = _swarm([4, 4, 3])  # 11 peers: 6 votes are a majority, 5 are not
    tally = CertificateTally(TASK, ATTEMPT, roster)
    assert tally.add(_certificate(identities, _members(roster, "cohort-0")[:3], "cohort-0"))
    assert tally.add(_certificate(identities, _members(roster, "cohort-2")[:2], "cohort-2"))
    assert tally.committed() is None and len(tally.counted(RESULT)) == 5
    assert tally.add(_certificate(identities, _members(roster, "cohort-1")[:1], "cohort-1"))
    assert tally.committed() == RESULT and len(tally.counted(RESULT)) == 6
    assert tally.votes_checked == 6


def test_minority_certificates_of_one_cohort_add_up_to_a_majority():
    identities, roster = _swarm([5])
    members = _members(roster, "cohort-0")
    tally = CertificateTally(TASK, ATTEMPT, roster)
    tally.add(_certificate(identities, members[:2], "cohort-0"))
    assert tally.committed() is None
    assert not tally.add(_certificate(identities, members[:2], "cohort-0"))  # nothing new: no checks
    assert tally.votes_checked == 2
    tally.add(_certificate(identities, members[1:3], "cohort-0"))
    assert tally.committed() == RESULT and tally.votes_checked == 3  # 3 of 5


def test_a_vote_signed_by_another_key_is_refused_and_a_certificate_of_only_such_keeps_nothing():
    identities, roster = _swarm([3, 3])
    a, b, c = _members(roster, "cohort-0")
    forged = {b: sign_vote(identities[a], TASK, ATTEMPT, RESULT, GROUP)}  # a signs in b's name
    tally = CertificateTally(TASK, ATTEMPT, roster)
    with pytest.raises(BadVote, match=b[-8:]):
        tally.add(CommitCertificate(TASK, ATTEMPT, "cohort-0", RESULT, GROUP, forged))
    assert tally.certificates() == [] and tally.counted(RESULT) == frozenset()
    assert tally.votes_refused == 1


def test_a_relay_that_adds_forged_or_foreign_votes_cannot_sink_the_honest_ones():
    identities, roster = _swarm([3, 3])
    a, b, c = _members(roster, "cohort-0")
    stranger = Identity.from_seed(hashlib.sha256(b"a key outside the roster").digest())
    honest = _certificate(identities, [a, b], "cohort-0")
    tampered = dict(honest.votes)
    tampered[c] = sign_vote(identities[a], TASK, ATTEMPT, RESULT, GROUP)  # forged in c's name
    tampered[peer_id_of(stranger)] = sign_vote(stranger, TASK, ATTEMPT, RESULT, GROUP)  # not in the roster
    tally = CertificateTally(TASK, ATTEMPT, roster)
    assert tally.add(CommitCertificate(TASK, ATTEMPT, "cohort-0", RESULT, GROUP, tampered))
    assert tally.votes_refused == 2
    assert tally.counted(RESULT) == {a, b}
    assert set(tally.certificates()[0].votes) == {a, b}  # what it passes on holds only valid votes
    assert tally.voters() == {a, b}


def test_votes_replayed_into_another_attempt_or_result_do_not_check_out():
    identities, roster = _swarm([3])
    old = _certificate(identities, _members(roster, "cohort-0"), "cohort-0", attempt=ATTEMPT - 1)
    with pytest.raises(WrongAttempt):
        CertificateTally(TASK, ATTEMPT, roster).add(old)
    replayed = CommitCertificate(TASK, ATTEMPT, "cohort-0", RESULT, GROUP, old.votes)
    with pytest.raises(BadVote):
        CertificateTally(TASK, ATTEMPT, roster).add(replayed)
    relabelled = CommitCertificate(TASK, ATTEMPT - 1, "cohort-0", OTHER_RESULT, GROUP, old.votes)
    with pytest.raises(BadVote):
        CertificateTally(TASK, ATTEMPT - 1, roster).add(relabelled)
    departure = _certificate(identities, _members(roster, "cohort-0"), "cohort-0", digest=DEPARTED)
    as_result = CommitCertificate(TASK, ATTEMPT, "cohort-0", RESULT, GROUP, departure.votes)
    with pytest.raises(BadVote):  # a departure cannot be passed off as a vote for a result
        CertificateTally(TASK, ATTEMPT, roster).add(as_result)


def test_a_key_outside_the_roster_counts_for_nothing_and_a_scope_only_routes_votes():
    identities, roster = _swarm([3, 3])
    sybil = Identity.from_seed(hashlib.sha256(b"a throw-away key").digest())
    vote = {peer_id_of(sybil): sign_vote(sybil, TASK, ATTEMPT, RESULT, GROUP)}
    tally = CertificateTally(TASK, ATTEMPT, roster)
    with pytest.raises(UnknownVoter):
        tally.add(CommitCertificate(TASK, ATTEMPT, "cohort-0", RESULT, GROUP, vote))
    # a roster peer's vote counts whichever cohort it travels in: verifiers whose rosters rank the
    # cohorts differently name them differently
    member = _members(roster, "cohort-1")[0]
    assert tally.add(_certificate(identities, [member], "cohort-0"))
    assert tally.add(_certificate(identities, _members(roster, "cohort-0")[:2], "a-scope-this-roster-lacks"))
    assert len(tally.counted(RESULT)) == 3 and tally.committed() is None  # 3 of 6
    assert tally.add(_certificate(identities, _members(roster, "cohort-1")[1:2], "cohort-1"))
    assert tally.committed() == RESULT


def test_an_equivocating_voter_is_named_and_counts_for_neither_result():
    identities, roster = _swarm([3, 2])  # 5 peers: 3 votes are a majority
    a, b, c = _members(roster, "cohort-0")
    d, e = _members(roster, "cohort-1")
    tally = CertificateTally(TASK, ATTEMPT, roster)
    tally.add(_certificate(identities, [a, b], "cohort-0"))
    tally.add(_certificate(identities, [d], "cohort-1"))
    assert tally.committed() == RESULT
    tally.add(_certificate(identities, [b, c], "cohort-0", digest=OTHER_RESULT))
    assert [e.peer_id for e in tally.equivocations] == [b]
    assert tally.committed() is None  # without b's votes neither result has 3
    tally.add(_certificate(identities, [e], "cohort-1", digest=DEPARTED))
    assert tally.committed() is None  # a and d: 2 of the 4 left, not more than half
    assert "voted for" in tally.equivocations[0].describe()


def test_two_verifiers_that_saw_different_votes_and_departures_never_commit_different_results():
    """Every key votes once; each verifier hears a random part of the votes. Fails with a rule that
    lets a cohort's majority speak for departed members it did not see leave."""
    rng = random.Random(54)
    committed_and_decided = 0
    swarms = [_swarm(sizes) for sizes in ([3, 3], [3, 3, 3], [2, 3, 4], [4, 4, 1], [1, 2, 3, 4])]
    for trial in range(1500):
        identities, roster = rng.choice(swarms)
        sizes = [len(roster.members_of(c)) for c in sorted(set(roster.cohorts.values()))]
        weights = [rng.random() ** 2 for _ in range(5)]  # each trial its own mix of outcomes
        outcomes = rng.choices([RESULT, OTHER_RESULT, ABORTED, DEPARTED, None], weights, k=len(roster))
        vote_of = dict(zip(roster.keys, outcomes))
        certificates = [
            _certificate(identities, [peer], roster.cohorts[peer], digest)
            for peer, digest in vote_of.items()
            if digest is not None
        ]
        decisions = []
        for _verifier in range(2):
            tally = CertificateTally(TASK, ATTEMPT, roster)
            heard = rng.uniform(0.6, 1.0)
            for certificate in certificates:
                if rng.random() < heard:
                    tally.add(certificate)
            decisions.append(tally.decided())
            assert tally.equivocations == []
        if None not in decisions:
            committed_and_decided += decisions != [ABORTED, ABORTED]
            assert decisions[0] == decisions[1], (trial, sizes, vote_of)
    assert committed_and_decided > 30  # the draws exercise commits, not only open or aborted attempts


def test_departures_leave_the_majority():
    identities, roster = _swarm([3, 3])  # 6 peers
    a, b, c = _members(roster, "cohort-0")
    d, e, f = _members(roster, "cohort-1")
    tally = CertificateTally(TASK, ATTEMPT, roster)
    tally.add(_certificate(identities, [a, b], "cohort-0"))
    tally.add(_certificate(identities, [d], "cohort-1", digest=DEPARTED))
    assert tally.committed() is None and tally.majority_of() == 5  # 2 of 5
    tally.add(_certificate(identities, [e], "cohort-1", digest=DEPARTED))
    assert tally.committed() is None and tally.majority_of() == 4  # 2 of 4 is not more than half
    tally.add(_certificate(identities, [f], "cohort-1", digest=DEPARTED))
    assert tally.committed() == RESULT and tally.departed() == {d, e, f}  # 2 of 3


def test_failures_stay_in_the_majority_and_an_attempt_aborts_once_no_result_can_reach_it():
    identities, roster = _swarm([3, 3])  # 6 peers
    a, b, c = _members(roster, "cohort-0")
    d, e, f = _members(roster, "cohort-1")
    tally = CertificateTally(TASK, ATTEMPT, roster)
    tally.add(_certificate(identities, [a], "cohort-0"))
    tally.add(_certificate(identities, [b, c], "cohort-0", digest=ABORTED))
    assert tally.decided() is None and tally.majority_of() == 6  # d, e, f may still vote: 4 of 6
    tally.add(_certificate(identities, [d], "cohort-1", digest=DEPARTED))
    assert tally.decided() is None  # e and f may still vote for it: 3 of 5
    tally.add(_certificate(identities, [e], "cohort-1", digest=ABORTED))
    assert tally.decided() == ABORTED  # at best a and f: 2 of 5
    assert tally.voters() == {a, b, c, d, e}


def test_an_abort_majority_is_never_a_commit_and_a_decided_abort_never_turns():
    rng = random.Random(541)
    for trial in range(40):
        sizes = [rng.randint(1, 5) for _ in range(rng.randint(1, 6))]
        identities, roster = _swarm(sizes)
        peers = list(roster.keys)
        rng.shuffle(peers)
        vote_of = {p: rng.choice([RESULT, OTHER_RESULT, ABORTED, ABORTED, DEPARTED]) for p in peers}
        tally = CertificateTally(TASK, ATTEMPT, roster)
        aborted_after = None
        for n, peer in enumerate(peers):
            tally.add(_certificate(identities, [peer], roster.cohorts[peer], vote_of[peer]))
            decided = tally.decided()
            assert decided == tally.committed() or decided == ABORTED or decided is None
            if decided == ABORTED and aborted_after is None:
                aborted_after = n
            if aborted_after is not None:
                assert tally.decided() == ABORTED and tally.committed() is None, (trial, sizes)
        assert tally.decided() is not None, (trial, sizes)  # every vote in: decided either way


def test_a_certificate_travels_as_canonical_json_and_malformed_bytes_say_why():
    identities, roster = _swarm([3])
    certificate = _certificate(identities, _members(roster, "cohort-0"), "cohort-0")
    wire = certificate.to_wire()
    assert CommitCertificate.from_wire(wire) == certificate
    assert wire == CommitCertificate.from_wire(wire).to_wire()
    with pytest.raises(MalformedCertificate, match="over the"):
        CommitCertificate.from_wire(b" " * (MAX_WIRE_BYTES + 1))
    with pytest.raises(MalformedCertificate):
        CommitCertificate.from_wire(b"{not json")
    with pytest.raises(MalformedCertificate, match="digest"):
        CommitCertificate.from_wire(wire.replace(RESULT.encode(), b"XYZ"))
    peer, signature = next(iter(certificate.votes.items()))
    twice = wire.replace(b'"votes":[', f'"votes":[["{peer}","{"0" * 128}"],'.encode())
    with pytest.raises(MalformedCertificate, match="twice"):
        CommitCertificate.from_wire(twice)
    with pytest.raises(MalformedCertificate, match="128 hex"):
        CommitCertificate.from_wire(wire.replace(signature.encode(), b"ab"))


def test_votes_for_one_result_under_two_group_ids_still_make_a_majority():
    identities, roster = _swarm([3])
    a, b, c = _members(roster, "cohort-0")
    other_group = hashlib.sha256(b"a group seen with another contributor list").hexdigest()
    tally = CertificateTally(TASK, ATTEMPT, roster)
    tally.add(_certificate(identities, [a], "cohort-0"))
    vote = sign_vote(identities[b], TASK, ATTEMPT, RESULT, other_group)
    tally.add(CommitCertificate(TASK, ATTEMPT, "cohort-0", RESULT, other_group, {b: vote}))
    assert tally.committed() == RESULT and tally.equivocations == []
