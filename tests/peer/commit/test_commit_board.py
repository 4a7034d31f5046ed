"""The signed commit board on a real hivemind DHT, and the quorum rule that decides on it.

A departure notice fails its attempt without moving the swarm's attempt counter (which would make the
others skip past the notice). A result commits once a quorum of the roster holds it: never two results
of one attempt, never a wait for peers that cannot change the outcome. Sitting attempts out on this
board: tests/peer/test_sitting_out.py.
"""

from __future__ import annotations

import itertools
import threading
import time

import pytest
import torch

from hivemind_adapter.dht import speaker
from peer.averaging.outcome import AveragingOutcome
from peer.commit import boards
from peer.commit.boards import NEAR_WINDOW, SignedCommitBoard
from peer.commit.quorum import (
    CommittedState,
    attempt_decided,
    is_quorum,
    newest_committed_state,
    quorum_late,
)
from peer.commit.report import CommitReport
from peer.commit.waits import WITNESS_GRACE_SECONDS, await_attempt_decided, await_commit, await_quorum_reports
from protocol.dht_schema import COMMIT_BUCKETS, commits_key
from protocol.identity import Identity
from protocol.proof_attestation import ProofAttestation, group_tag, proofs_digest
from tests.helpers import two_task_dhts

TASK = "digits-board-test"


@pytest.fixture
def two_boards():
    with two_task_dhts(TASK) as dhts:
        yield [SignedCommitBoard(d, TASK, speaker(d, Identity.generate())) for d in dhts]


def test_a_departure_notice_fails_its_attempt_but_does_not_count_as_one(two_boards):
    stayer, leaver = two_boards
    digest = "ab" * 32
    stayer.post(3, CommitReport(ok=True, digest=digest))
    leaver.post(3, CommitReport(ok=True, digest=digest))
    leaver.post(4, CommitReport.departure())  # the leaver's next attempt: it will not be there

    assert stayer.latest_attempt() == 3  # so the stayer's next attempt is 4, the one the notice names
    reports = stayer.read(4)
    assert reports == {leaver.peer_id: CommitReport.departure()}
    # an attempt someone actually ran (and failed) does move the counter
    leaver.post(4, CommitReport())
    assert stayer.latest_attempt() == 4


def test_attempts_that_share_a_bucket_are_read_apart_and_the_newest_is_found_in_any_bucket(two_boards):
    """The board is spread over COMMIT_BUCKETS keys by attempt: a read returns its attempt's reports
    only, though attempts COMMIT_BUCKETS apart share a key, and the newest attempt is found whichever
    bucket holds it."""
    writer, reader = two_boards
    last = COMMIT_BUCKETS + 4
    for attempt in range(last + 1):
        writer.post(attempt, CommitReport(ok=True, digest=f"{attempt:064x}"))
    writer.post(last + 1, CommitReport.departure())  # a departure notice does not count as an attempt
    assert commits_key(TASK, 3) == commits_key(TASK, 3 + COMMIT_BUCKETS)
    for attempt in (3, 3 + COMMIT_BUCKETS, last):
        assert reader.read(attempt) == {writer.peer_id: CommitReport(ok=True, digest=f"{attempt:064x}")}
    assert reader.latest_attempt() == last
    writer.post(last + 2, CommitReport())  # an attempt run and failed, in another bucket
    assert reader.latest_attempt() == last + 2


def test_the_latest_attempt_near_a_peers_last_reads_a_few_buckets_and_agrees_with_every_bucket(
    two_boards, monkeypatch
):
    """A peer asks for the swarm's latest attempt once a round, near the attempt it just ended: the
    buckets of NEAR_WINDOW attempts from there on tell, unless the swarm may be further on."""
    writer, reader = two_boards
    for attempt in range(10):
        writer.post(attempt, CommitReport(ok=True, digest=f"{attempt:064x}"))
    keys_read = []
    read_keys = boards.read_entries_of_keys
    monkeypatch.setattr(
        boards, "read_entries_of_keys", lambda dht, keys: keys_read.append(len(keys)) or read_keys(dht, keys)
    )
    assert reader.latest_attempt(near=8) == 9 and keys_read == [NEAR_WINDOW]
    keys_read.clear()
    assert reader.latest_attempt(near=2) == 9  # attempts 2..5 all ended: the swarm may be further on
    assert keys_read == [NEAR_WINDOW, COMMIT_BUCKETS]
    for near in range(-1, 14):  # whatever the hint, the answer every bucket gives
        assert reader.latest_attempt(near=near) == reader.latest_attempt() == 9, near
        assert reader.latest_attempt(peers={reader.peer_id}, near=near) == -1, near


def test_a_cohort_reads_where_its_own_peers_are_not_where_another_cohort_ran_ahead(two_boards):
    """An outer task's cohorts take their inner steps apart: a cohort's next attempt is one past the
    highest its own peers posted, whatever another cohort, already a step ahead, posted."""
    here, elsewhere = two_boards
    here.post(4, CommitReport(ok=True, digest="ab" * 32))
    elsewhere.post(5, CommitReport(ok=True, digest="cd" * 32))
    elsewhere.post(6, CommitReport())
    assert here.latest_attempt() == 6
    assert here.latest_attempt(peers={here.peer_id}) == 4
    assert here.latest_attempt(peers={elsewhere.peer_id}) == 6
    assert here.latest_attempt(peers=set()) == -1


def test_two_quorums_of_one_roster_always_share_a_peer():
    roster = [f"peer-{i}" for i in range(6)]
    for size in range(1, 7):
        for a in itertools.combinations(roster, size):
            for b in itertools.combinations(sorted(set(roster) - set(a)), 6 - size):
                assert not (is_quorum(a, roster) and is_quorum(b, roster)), (a, b)
    assert is_quorum(roster[:4], roster) and not is_quorum(roster[:3], roster)  # a strict majority
    # Rosters read a moment apart may differ by one peer (a joiner): majorities of both still meet.
    joined = [*roster, "joiner"]
    for a in itertools.combinations(roster, 4):
        for b in itertools.combinations([p for p in joined if p not in a], 4):
            assert not is_quorum(b, joined), (a, b)
    assert not is_quorum(["stranger", "other"], roster[:1])  # peers outside the roster do not count
    assert not is_quorum([], [])


def test_a_result_commits_once_a_quorum_holds_it_without_waiting_for_the_rest(two_boards):
    stayer, other = two_boards
    digest = "cd" * 32
    roster = {stayer.peer_id, other.peer_id, "QmSilentPeerThatNeverAverages"}
    stayer.post(7, CommitReport(ok=True, digest=digest))
    other.post(7, CommitReport(ok=True, digest=digest))
    started = time.monotonic()
    decision = await_commit(stayer, 7, digest, roster, deadline_seconds=30)
    assert decision.committed and decision.agreeing == 2, decision
    assert time.monotonic() - started < 10, "waited for the silent peer"


def test_a_result_the_others_contradict_is_given_up_at_once(two_boards):
    stayer, other = two_boards
    stayer.post(8, CommitReport(ok=True, digest="aa" * 32))
    other.post(8, CommitReport(ok=True, digest="bb" * 32))
    started = time.monotonic()
    decision = await_commit(stayer, 8, "aa" * 32, [stayer.peer_id, other.peer_id], deadline_seconds=30)
    assert not decision.committed and "no quorum for this result" in decision.reason, decision
    assert not decision.timed_out  # decided against it: not a wait that ran out
    assert time.monotonic() - started < 10
    # Half of the roster, the other half silent: it waits, bounded (and says the wait ran out, which
    # spares it a second wait for the outcome in the settle: HierarchicalAverager.settle).
    lonely = await_commit(stayer, 8, "aa" * 32, [stayer.peer_id, "QmSilentPeer"], deadline_seconds=1.0)
    assert not lonely.committed and "within 1 s" in lonely.reason and lonely.timed_out


def test_a_departed_peer_no_longer_counts_in_the_roster(two_boards):
    stayer, leaver = two_boards
    leaver.post(9, CommitReport.departure())
    stayer.post(9, CommitReport(ok=True, digest="ee" * 32))
    decision = await_commit(stayer, 9, "ee" * 32, {stayer.peer_id, leaver.peer_id}, deadline_seconds=30)
    assert decision.committed, decision
    assert await_quorum_reports(stayer, 9, {stayer.peer_id, leaver.peer_id}, deadline_seconds=5)
    assert not await_quorum_reports(stayer, 10, {stayer.peer_id, leaver.peer_id}, deadline_seconds=0.5)


def test_peers_gone_from_the_roster_end_the_wait_for_a_quorum_but_never_make_one(two_boards):
    # A roster of four: the stayer holds its result, the other agrees, "QmDead" and "QmCutOff" are
    # gone from the roster (killed, or cut off). They will not report in attempt 20: the wait for a
    # quorum ends once that shows (before, it ran out the whole commit deadline).
    stayer, other = two_boards
    roster = [stayer.peer_id, other.peer_id, "QmDead", "QmCutOff"]
    stayer.post(20, CommitReport(ok=True, digest="cc" * 32))
    asked = []

    def never() -> set[str]:
        asked.append(time.monotonic())
        return {"QmDead", "QmCutOff"}

    started = time.monotonic()
    decision = await_commit(stayer, 20, "cc" * 32, roster, deadline_seconds=60, never=never)
    assert not decision.committed and "2 gone from the roster" in decision.reason, decision
    assert time.monotonic() - started < 30 and len(asked) == 1
    # A peer that settles after a failed attempt stops waiting for them too.
    assert await_quorum_reports(stayer, 20, [stayer.peer_id, "QmDead", "QmCutOff"], 60, never=never)
    assert await_attempt_decided(stayer, 20, roster, deadline_seconds=60, never=never)
    # They never count towards a quorum: the other's agreeing report makes 2 of 4, not a quorum of
    # the 2 left; and without them the same wait still runs to its deadline.
    other.post(20, CommitReport(ok=True, digest="cc" * 32))
    assert not await_commit(stayer, 20, "cc" * 32, roster, deadline_seconds=60, never=never).committed
    # Decided only because they are gone: 2 of 4 with the other two still to report is open.
    assert attempt_decided(stayer.read(20), roster, {"QmDead", "QmCutOff"})
    assert not attempt_decided(stayer.read(20), roster)
    lonely = await_commit(stayer, 20, "cc" * 32, roster, deadline_seconds=1.0)
    assert not lonely.committed and "within 1 s" in lonely.reason


def test_an_attempt_is_decided_once_a_result_holds_a_quorum_or_none_can():
    roster = ["p0", "p1", "p2", "p3"]
    ok = CommitReport(ok=True, digest="d1")
    failed = CommitReport()
    # Two of four hold d1 and one failed: the fourth, silent (dead, or still averaging), could make
    # d1 a quorum, so the holders of d1 still wait for their commit.
    waiting = {"p0": ok, "p1": ok, "p2": failed}
    assert not attempt_decided(waiting, roster)
    assert attempt_decided({**waiting, "p3": ok}, roster)  # d1 holds 3 of 4: committed
    assert attempt_decided({**waiting, "p3": CommitReport(ok=True, digest="d2")}, roster)  # nobody can commit
    assert attempt_decided({**waiting, "p3": CommitReport.departure()}, roster)  # 2 of 3
    # Nothing posted yet, or only failures from a minority: the silent majority may still agree.
    assert not attempt_decided({}, roster)
    assert not attempt_decided({"p0": failed}, roster)
    assert attempt_decided({p: failed for p in roster[:2]}, roster)
    assert not attempt_decided({"p0": ok, "stranger": ok}, roster)  # outsiders do not count


def test_a_failed_peer_waits_until_the_attempt_is_decided_bounded(two_boards):
    stayer, other = two_boards
    roster = {stayer.peer_id, other.peer_id, "QmSilentPeer"}
    stayer.post(11, CommitReport())
    other.post(11, CommitReport(ok=True, digest="ab" * 32))
    started = time.monotonic()
    assert not await_attempt_decided(stayer, 11, roster, deadline_seconds=1.0)  # the silent peer could agree
    assert 1.0 <= time.monotonic() - started < 10
    other.post(12, CommitReport(ok=True, digest="ab" * 32))
    threading.Timer(0.5, lambda: stayer.post(12, CommitReport(ok=True, digest="ab" * 32))).start()
    assert await_attempt_decided(other, 12, roster, deadline_seconds=30)


def test_a_result_that_finds_its_quorum_after_the_commit_wait_commits_late(two_boards):
    # Two peers posted a result and gave up waiting for a quorum; a cohort head posted the same result
    # after its slow broadcast, saw the quorum and committed. The two that gave up commit it too once
    # they look again, rather than fall behind the swarm.
    early, late_head = two_boards
    roster = [early.peer_id, late_head.peer_id, "QmKilledPeer"]  # 2 of 3 is a quorum
    result = "5e" * 32
    tensors = [torch.arange(3.0)]
    gave_up = AveragingOutcome(committed=False, reason="no quorum within 6 s", digest=result, pending=tensors)
    early.post(5, CommitReport(ok=True, digest=result))
    assert not quorum_late(early.read(5), roster, result, None)  # still 1 of 3
    late_head.post(5, CommitReport(ok=True, digest=result))
    assert await_commit(late_head, 5, result, roster, 5.0).committed  # the head commits at once
    assert quorum_late(early.read(5), roster, result, None)
    late = gave_up.as_committed()
    assert late.committed and late.tensors is tensors and late.pending is None and not late.reason
    # Only the result it posted, and only a strict majority of the roster, ever commits.
    assert not quorum_late(early.read(5), roster, "77" * 32, None)
    assert not quorum_late(early.read(5), [*roster, "QmOther1", "QmOther2"], result, None)
    # A round that failed before it had a result to post has nothing to commit.
    assert not quorum_late(early.read(5), roster, "", None)


def test_a_peer_catching_up_finds_the_newest_state_a_quorum_holds_and_its_holders(two_boards):
    a, b = two_boards
    roster = [a.peer_id, b.peer_id, "QmAbsentPeer"]  # 2 of 3 is a quorum
    r5, r6, r7 = "11" * 32, "22" * 32, "33" * 32  # averaged results
    s5, s6, s7 = "aa" * 32, "bb" * 32, "cc" * 32  # the states after applying them
    assert newest_committed_state(a, roster) is None  # an empty board: fall back to state sharing
    for board in (a, b):
        board.post(5, CommitReport(ok=True, digest=r5))
        board.post(
            5, CommitReport(ok=True, digest=r5, state=s5)
        )  # the same report again, once the step is applied
        board.post(6, CommitReport(ok=True, digest=r6))
    both = tuple(sorted([a.peer_id, b.peer_id]))
    # Attempt 6 committed, but nobody has reported the state after it yet: attempt 5's answers.
    assert newest_committed_state(b, roster) == CommittedState(5, s5, both)
    a.post(6, CommitReport(ok=True, digest=r6, state=s6))
    assert newest_committed_state(b, roster) == CommittedState(5, s5, both)  # one holder is no quorum
    b.post(6, CommitReport(ok=True, digest=r6, state=s6))
    a.post(7, CommitReport(ok=True, digest=r7))  # the newest attempt is still running
    b.post(7, CommitReport())
    assert newest_committed_state(b, roster) == CommittedState(6, s6, both)
    # The same reports are no majority of a bigger roster, nor is a state only one peer holds.
    assert newest_committed_state(a, [*roster, "QmOther1", "QmOther2"]) is None
    assert newest_committed_state(a, [a.peer_id, "QmOther1", "QmOther2"]) is None
    # A peer that reports a state the others do not hold does not make it the swarm's.
    b.post(6, CommitReport(ok=True, digest=r6, state=s7))
    assert newest_committed_state(a, roster) == CommittedState(5, s5, both)
    # A peer that posted a departure notice for an attempt is out of that attempt's roster.
    b.post(8, CommitReport.departure())
    a.post(8, CommitReport(ok=True, digest=r7))
    a.post(8, CommitReport(ok=True, digest=r7, state=s7))
    assert newest_committed_state(a, [a.peer_id, b.peer_id]) == CommittedState(8, s7, (a.peer_id,))


def test_a_cohort_that_split_finds_one_state_for_both_its_members(two_boards):
    """An outer task's cohort of two whose members committed different states of one attempt (each
    alone): neither is a quorum, but with ``any_holder`` both members pick the same one of them (the
    smallest holder's), and a newer report wins over both."""
    a, b = two_boards
    cohort = [a.peer_id, b.peer_id]
    sa, sb, s4 = "aa" * 32, "bb" * 32, "cc" * 32
    a.post(3, CommitReport(ok=True, digest="11" * 32, state=sa))
    b.post(3, CommitReport(ok=True, digest="22" * 32, state=sb))
    assert newest_committed_state(a, cohort) is None  # 1 of 2 each: no quorum
    first = min(cohort)
    expected = CommittedState(3, sa if first == a.peer_id else sb, (first,))
    assert newest_committed_state(a, cohort, any_holder=True) == expected
    assert newest_committed_state(b, cohort, any_holder=True) == expected
    assert newest_committed_state(a, ["QmOtherCohort"], any_holder=True) is None  # only its own peers
    b.post(4, CommitReport(ok=True, digest="33" * 32, state=s4))
    assert newest_committed_state(a, cohort, any_holder=True) == CommittedState(4, s4, (b.peer_id,))


def _told(reducer: Identity, reducer_id: str, story: bytes) -> str:
    """A reducer's signed word on the proofs it sent in one all-reduce (protocol.proof_attestation)."""
    return ProofAttestation.signed(reducer, group_tag(b"g" * 20), reducer_id, proofs_digest(story)).to_token()


def test_a_result_whose_members_hold_different_signed_proofs_of_one_reducer_never_commits(two_boards):
    # Both members hold the same result, a quorum; but the reducer signed a different proofs message
    # for each (each true about its member): the result may be any lie, and its reducer is named.
    a, b = two_boards
    reducer = Identity.generate()
    keys = {"QmReducerThatLied": reducer.public_key_hex}
    roster = {a.peer_id, b.peer_id}
    result = "e1" * 32
    a.post(
        11,
        CommitReport(
            ok=True, digest=result, proofs=(_told(reducer, "QmReducerThatLied", b"the story told to a"),)
        ),
    )
    b.post(
        11,
        CommitReport(
            ok=True, digest=result, proofs=(_told(reducer, "QmReducerThatLied", b"the story told to b"),)
        ),
    )
    decision = await_commit(a, 11, result, roster, deadline_seconds=30, public_keys=keys)
    assert not decision.committed and "different signed proofs" in decision.reason, decision
    assert decision.equivocation is not None and decision.equivocation.reducer == "QmReducerThatLied"
    assert not quorum_late(a.read(11), roster, result, keys)
    # the same stories told alike commit; a story forged in the reducer's name convicts nobody
    a.post(
        12, CommitReport(ok=True, digest=result, proofs=(_told(reducer, "QmReducerThatLied", b"one story"),))
    )
    forged = _told(Identity.generate(), "QmReducerThatLied", b"a story b made up")
    b.post(
        12,
        CommitReport(
            ok=True, digest=result, proofs=(_told(reducer, "QmReducerThatLied", b"one story"), forged)
        ),
    )
    assert await_commit(a, 12, result, roster, deadline_seconds=30, public_keys=keys).committed
    assert quorum_late(a.read(12), roster, result, keys)


def test_once_its_quorum_holds_a_peer_waits_briefly_for_the_other_contributors_reports(two_boards):
    # A quorum (2 of 3) holds the result, but the third contributor, whose proofs could show a
    # reducer's second story, has not posted: the peer waits for it, and commits at the grace's end
    # if it never comes (a contributor that stays silent costs the round that grace, not the round).
    a, b = two_boards
    roster = {a.peer_id, b.peer_id, "QmSlowContributor"}
    result = "e2" * 32
    a.post(13, CommitReport(ok=True, digest=result))
    b.post(13, CommitReport(ok=True, digest=result))
    started = time.monotonic()
    decision = await_commit(a, 13, result, roster, 30, witnesses=[b.peer_id, "QmSlowContributor"])
    waited = time.monotonic() - started
    assert decision.committed, decision
    assert WITNESS_GRACE_SECONDS <= waited < WITNESS_GRACE_SECONDS + 10, waited
    started = time.monotonic()
    assert await_commit(a, 13, result, roster, 30, witnesses=[b.peer_id]).committed
    assert time.monotonic() - started < WITNESS_GRACE_SECONDS, "waited for a witness that had posted"
