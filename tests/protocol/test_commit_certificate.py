"""Commit votes and certificates with real Ed25519 keys: a cohort's majority covers it, a round
commits on certificates covering a majority of the roster, and forged, foreign, replayed or
equivocating votes count for nothing."""

from __future__ import annotations

import hashlib
import random

import pytest

from protocol.commit_certificate import (
    ABORTED,
    MAX_WIRE_BYTES,
    BadVote,
    CertificateTally,
    CommitCertificate,
    ForeignVoter,
    MalformedCertificate,
    NoMajority,
    RosterSnapshot,
    UnknownScope,
    WrongAttempt,
    check_certificate,
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


def test_a_majority_of_a_cohort_covers_all_of_it_and_half_does_not():
    identities, roster = _swarm([4, 3])
    three = _members(roster, "cohort-0")[:3]
    checked = check_certificate(_certificate(identities, three, "cohort-0"), TASK, ATTEMPT, roster)
    assert checked.covered == roster.members_of("cohort-0") and checked.voters == frozenset(three)
    with pytest.raises(NoMajority, match="2 valid vote"):
        check_certificate(_certificate(identities, three[:2], "cohort-0"), TASK, ATTEMPT, roster)


def test_a_round_commits_once_certificates_cover_more_than_half_of_the_roster():
    identities, roster = _swarm([4, 4, 3])  # 11 peers: 6 covered is a majority, 4 is not
    tally = CertificateTally(TASK, ATTEMPT, roster)
    assert tally.add(_certificate(identities, _members(roster, "cohort-0")[:3], "cohort-0"))
    assert tally.committed() is None and len(tally.covered(RESULT)) == 4
    assert tally.add(_certificate(identities, _members(roster, "cohort-2")[:2], "cohort-2"))
    assert tally.committed() == RESULT and len(tally.covered(RESULT)) == 7
    assert tally.votes_checked == 5


def test_minority_certificates_of_one_cohort_add_up_to_a_majority():
    identities, roster = _swarm([5])
    members = _members(roster, "cohort-0")
    tally = CertificateTally(TASK, ATTEMPT, roster)
    tally.add(_certificate(identities, members[:2], "cohort-0"))
    assert tally.committed() is None
    assert not tally.add(_certificate(identities, members[:2], "cohort-0"))  # nothing new: no checks
    assert tally.votes_checked == 2
    tally.add(_certificate(identities, members[1:3], "cohort-0"))
    assert tally.committed() == RESULT and tally.votes_checked == 3


def test_a_vote_signed_by_another_key_is_refused_and_a_certificate_of_only_such_keeps_nothing():
    identities, roster = _swarm([3, 3])
    a, b, c = _members(roster, "cohort-0")
    forged = {b: sign_vote(identities[a], TASK, ATTEMPT, RESULT, GROUP)}  # a signs in b's name
    tally = CertificateTally(TASK, ATTEMPT, roster)
    with pytest.raises(BadVote, match=b[-8:]):
        tally.add(CommitCertificate(TASK, ATTEMPT, "cohort-0", RESULT, GROUP, forged))
    assert tally.certificates() == [] and tally.covered(RESULT) == frozenset()
    assert tally.votes_refused == 1


def test_a_relay_that_adds_forged_or_foreign_votes_cannot_sink_the_honest_ones():
    identities, roster = _swarm([3, 3])
    a, b, c = _members(roster, "cohort-0")
    outsider = _members(roster, "cohort-1")[0]
    honest = _certificate(identities, [a, b], "cohort-0")
    tampered = dict(honest.votes)
    tampered[c] = sign_vote(identities[a], TASK, ATTEMPT, RESULT, GROUP)  # forged in c's name
    tampered[outsider] = sign_vote(identities[outsider], TASK, ATTEMPT, RESULT, GROUP)  # not of cohort-0
    tally = CertificateTally(TASK, ATTEMPT, roster)
    assert tally.add(CommitCertificate(TASK, ATTEMPT, "cohort-0", RESULT, GROUP, tampered))
    assert tally.votes_refused == 2
    assert tally.covered(RESULT) == roster.members_of("cohort-0")  # a and b: 2 of 3
    assert set(tally.certificates()[0].votes) == {a, b}  # what it passes on holds only valid votes
    assert tally.voters() == {a, b}


def test_votes_replayed_into_another_attempt_or_result_do_not_check_out():
    identities, roster = _swarm([3])
    old = _certificate(identities, _members(roster, "cohort-0"), "cohort-0", attempt=ATTEMPT - 1)
    with pytest.raises(WrongAttempt):
        check_certificate(old, TASK, ATTEMPT, roster)
    replayed = CommitCertificate(TASK, ATTEMPT, "cohort-0", RESULT, GROUP, old.votes)
    with pytest.raises(BadVote):
        check_certificate(replayed, TASK, ATTEMPT, roster)
    relabelled = CommitCertificate(TASK, ATTEMPT - 1, "cohort-0", OTHER_RESULT, GROUP, old.votes)
    with pytest.raises(BadVote):
        check_certificate(relabelled, TASK, ATTEMPT - 1, roster)


def test_a_sybil_cannot_speak_for_a_cohort_it_is_not_in_nor_invent_one():
    identities, roster = _swarm([3, 3])
    sybil = _members(roster, "cohort-1")[0]
    with pytest.raises(ForeignVoter):
        check_certificate(_certificate(identities, [sybil], "cohort-0"), TASK, ATTEMPT, roster)
    with pytest.raises(UnknownScope):
        check_certificate(_certificate(identities, [sybil], "cohort-sybil"), TASK, ATTEMPT, roster)


def test_an_equivocating_voter_is_named_and_counts_for_neither_result():
    identities, roster = _swarm([3, 2])  # 5 peers: cohort-0 (3) alone is a majority
    a, b, c = _members(roster, "cohort-0")
    tally = CertificateTally(TASK, ATTEMPT, roster)
    tally.add(_certificate(identities, [a, b], "cohort-0"))
    assert tally.committed() == RESULT
    tally.add(_certificate(identities, [b, c], "cohort-0", digest=OTHER_RESULT))
    assert [e.peer_id for e in tally.equivocations] == [b]
    assert tally.committed() is None  # without b's votes neither result holds cohort-0's majority
    assert "voted for" in tally.equivocations[0].describe()


def test_two_results_never_both_commit_when_every_key_votes_once():
    rng = random.Random(54)
    for trial in range(20):
        sizes = [rng.randint(1, 6) for _ in range(rng.randint(2, 7))]
        identities, roster = _swarm(sizes)
        digests = [RESULT, OTHER_RESULT]
        vote_of = {peer: rng.choice(digests) for peer in roster.keys if rng.random() < 0.9}
        tally = CertificateTally(TASK, ATTEMPT, roster)
        for c in range(len(sizes)):
            for digest in digests:
                voters = [p for p in _members(roster, f"cohort-{c}") if vote_of.get(p) == digest]
                if voters:
                    tally.add(_certificate(identities, voters, f"cohort-{c}", digest))
        committed = [d for d in digests if 2 * len(tally.covered(d)) > len(roster)]
        assert len(committed) <= 1, (trial, sizes)
        assert tally.equivocations == []


def test_aborts_decide_an_attempt_once_no_result_can_reach_a_majority():
    identities, roster = _swarm([3, 2])  # 5 peers
    a, b, c = _members(roster, "cohort-0")
    d, e = _members(roster, "cohort-1")
    tally = CertificateTally(TASK, ATTEMPT, roster)
    tally.add(_certificate(identities, [a], "cohort-0"))
    tally.add(_certificate(identities, [d], "cohort-1", digest=ABORTED))
    assert tally.decided() is None  # b and c may still cover cohort-0 (3 of 5)
    tally.add(_certificate(identities, [b], "cohort-0", digest=ABORTED))
    assert tally.decided() is None  # c's vote for RESULT would cover cohort-0
    tally.add(_certificate(identities, [c], "cohort-0", digest=ABORTED))
    assert tally.decided() == ABORTED  # cohort-0 is lost to every result; cohort-1 alone is 2 of 5
    assert tally.committed() is None
    assert tally.voters() == {a, b, c, d}


def test_an_abort_majority_is_never_a_commit_and_a_decided_abort_never_turns():
    rng = random.Random(541)
    for trial in range(40):
        sizes = [rng.randint(1, 5) for _ in range(rng.randint(1, 6))]
        identities, roster = _swarm(sizes)
        peers = list(roster.keys)
        rng.shuffle(peers)
        vote_of = {p: rng.choice([RESULT, OTHER_RESULT, ABORTED, ABORTED]) for p in peers}
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


def test_votes_for_one_result_under_two_group_ids_still_make_a_cohort_majority():
    identities, roster = _swarm([3])
    a, b, c = _members(roster, "cohort-0")
    other_group = hashlib.sha256(b"a group seen with another contributor list").hexdigest()
    tally = CertificateTally(TASK, ATTEMPT, roster)
    tally.add(_certificate(identities, [a], "cohort-0"))
    vote = sign_vote(identities[b], TASK, ATTEMPT, RESULT, other_group)
    tally.add(CommitCertificate(TASK, ATTEMPT, "cohort-0", RESULT, other_group, {b: vote}))
    assert tally.committed() == RESULT and tally.equivocations == []
