"""Aborted rounds whose posted result finds its quorum later (RoundCommitter.pending_with_quorum), read
from a real signed commit board on a real hivemind DHT.

Two peers gave up on an attempt and settled; the other cohort's head posted the same result later and
committed with them as its quorum. Looking once after the settle is too early: a peer keeps the
round's result and looks before each later round, while it still holds the state it started from.
"""

from __future__ import annotations

import time

import pytest

from hivemind_adapter.dht import speaker
from peer.averaging.factory import committer_for
from peer.averaging.stage import AveragingTimeouts
from peer.commit.boards import SignedCommitBoard
from peer.commit.committer import PENDING_KEPT, PendingResult
from peer.commit.report import CommitReport
from protocol.identity import Identity
from tests.helpers import two_task_dhts

TASK = "digits-pending-test"
START = "5a" * 32  # the state the pending rounds started from


@pytest.fixture
def boards():
    with two_task_dhts(TASK) as dhts:
        yield [SignedCommitBoard(d, TASK, speaker(d, Identity.generate())) for d in dhts]


def _gave_up(attempt: int, roster: tuple[str, ...], result: str, start: str = START) -> PendingResult:
    return PendingResult(
        attempt, frozenset(roster), result, start, None, time.monotonic(), f"round of {attempt}"
    )


def test_a_result_whose_quorum_shows_after_the_settle_commits_before_the_next_round(boards):
    me, head = boards
    commits = committer_for(me, AveragingTimeouts())
    roster = (me.peer_id, head.peer_id, "QmKilledPeer")  # 2 of 3 is a quorum
    result = "5e" * 32
    pending = _gave_up(8, roster, result)
    commits.hold(pending)
    me.post(8, CommitReport(ok=True, digest=result))  # this peer's result; it gave up waiting and settled
    assert commits.pending_with_quorum(START) is None  # 1 of 3: still nothing to commit
    head.post(8, CommitReport(ok=True, digest=result))  # the head's broadcast ended: the same result
    assert commits.pending_with_quorum(START) is pending
    # a peer whose state changed since (a commit or a catch-up) has nothing pending any more
    assert commits.pending_with_quorum("6b" * 32) is None
    assert commits.pending_with_quorum(START) is None


def test_only_the_posted_result_commits_and_the_newest_pending_round_is_taken_first(boards):
    me, head = boards
    commits = committer_for(me, AveragingTimeouts())
    roster = (me.peer_id, head.peer_id, "QmKilledPeer")
    older, newer = _gave_up(8, roster, "5e" * 32), _gave_up(9, roster, "6f" * 32)
    commits.hold(older)
    commits.hold(newer)
    me.post(8, CommitReport(ok=True, digest="5e" * 32))
    head.post(8, CommitReport(ok=True, digest="77" * 32))  # the head's result differs: no quorum for ours
    assert commits.pending_with_quorum(START) is None
    me.post(9, CommitReport(ok=True, digest="6f" * 32))
    head.post(9, CommitReport(ok=True, digest="6f" * 32))
    head.post(8, CommitReport(ok=True, digest="5e" * 32))  # both would commit now: the newest is the swarm's
    assert commits.pending_with_quorum(START) is newer
    # A larger roster makes 2 holders a minority: nothing commits.
    bigger = committer_for(me, AveragingTimeouts())
    bigger.hold(_gave_up(9, (*roster, "QmOther1", "QmOther2"), "6f" * 32))
    assert bigger.pending_with_quorum(START) is None


def test_only_the_newest_pending_results_are_kept(boards):
    me, _head = boards
    commits = committer_for(me, AveragingTimeouts())
    held = [_gave_up(a, (me.peer_id,), f"{a:064x}") for a in range(PENDING_KEPT + 2)]
    for p in held:
        commits.hold(p)
    for p in held[:2]:  # the two oldest would commit, but are no longer kept
        me.post(p.attempt, CommitReport(ok=True, digest=p.digest))
    assert commits.pending_with_quorum(START) is None
    me.post(held[2].attempt, CommitReport(ok=True, digest=held[2].digest))
    assert commits.pending_with_quorum(START) is held[2]
