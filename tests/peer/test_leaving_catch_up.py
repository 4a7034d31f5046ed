"""A peer leaving on Ctrl-C ends on the state the swarm ends on (peer.catch_up.catch_up_before_leaving),
read from a real signed commit board on a real hivemind DHT.

The leaver's state is its swarm view: ``catch_up`` loads the newest state a quorum of the board
committed, as the agent's does; the round the others compute is what their progress records would
show. Attempt ``a`` trains round ``a`` here.
"""

from __future__ import annotations

import threading

import pytest

from hivemind_adapter.dht import speaker
from peer.catch_up import catch_up_before_leaving
from peer.commit.boards import SignedCommitBoard
from peer.commit.quorum import newest_committed_state
from peer.commit.report import CommitReport
from protocol.identity import Identity
from tests.helpers import two_task_dhts, wait_until

TASK = "digits-leaving-test"


@pytest.fixture
def boards():
    with two_task_dhts(TASK) as dhts:
        yield [SignedCommitBoard(d, TASK, speaker(d, Identity.generate())) for d in dhts]


class Leaver:
    """The leaving peer's side: its state's round, the round the others are seen computing, and a
    thread running :func:`catch_up_before_leaving`."""

    def __init__(self, board: SignedCommitBoard, others: list[str], state_round: int, running: int, **timing):
        self.board, self.others = board, others
        self.state_round, self.running = state_round, running
        self.announced: list[int] = []
        self.result: list[int] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._leave, kwargs=timing, daemon=True)
        self.thread.start()

    def _catch_up(self) -> bool:
        newest = newest_committed_state(self.board, self.others)
        if newest is None or newest.attempt <= self.state_round:
            return False
        self.state_round = newest.attempt
        return True

    def _leave(self, **timing) -> None:
        self.result.append(
            catch_up_before_leaving(
                self._catch_up,
                lambda: self.state_round,
                lambda: self.running,
                self.board,
                self.stop,
                self.announced.append,
                poll=0.1,
                **timing,
            )
        )

    def ended(self, timeout: float) -> bool:
        self.thread.join(timeout)
        return not self.thread.is_alive()


def test_a_leaver_whose_last_round_aborted_loads_the_round_the_others_committed_without_waiting(boards):
    leaver, other = boards
    other.post(
        2, CommitReport(ok=True, digest="22" * 32, state="b2" * 32)
    )  # the others committed round 2; nobody computes round 3
    left = Leaver(leaver, [other.peer_id], state_round=1, running=2)
    assert left.ended(10) and left.result == [2] and left.announced == []


def test_a_leaver_waits_for_the_round_the_others_are_finishing_and_ends_on_its_state(boards):
    leaver, other = boards
    other.post(2, CommitReport(ok=True, digest="22" * 32, state="b2" * 32))
    left = Leaver(leaver, [other.peer_id], state_round=2, running=3, outcome_grace=60.0)
    wait_until(lambda: left.announced, 10, "the leaver to say which round it waits for", poll=0.05)
    assert left.announced == [3]
    assert not left.ended(1.0), "left before the round the others compute ended"
    other.post(
        3, CommitReport(ok=True, digest="33" * 32)
    )  # the result: committed a moment later, when its state is reported
    assert not left.ended(1.0)
    other.post(3, CommitReport(ok=True, digest="33" * 32, state="b3" * 32))
    assert left.ended(10) and left.result == [3]


def test_a_result_whose_state_reports_come_after_the_grace_is_waited_for(boards):
    """With churn, a leaver whose cohort missed the top group ended 5 s after the round's first result,
    before the quorum's state reports, and left on the round before the one the swarm ended on."""
    leaver, other = boards
    other.post(2, CommitReport(ok=True, digest="22" * 32, state="b2" * 32))
    left = Leaver(leaver, [other.peer_id], state_round=2, running=3, outcome_grace=0.5)
    wait_until(lambda: left.announced, 10, "the leaver to wait for round 3", poll=0.05)
    other.post(3, CommitReport(ok=True, digest="33" * 32))  # the result; its state report comes later
    assert not left.ended(2.0), "left with the round's result posted and its state yet to show"
    other.post(3, CommitReport(ok=True, digest="33" * 32, state="b3" * 32))
    assert left.ended(10) and left.result == [3]


def test_a_round_that_aborts_ends_the_wait_after_its_grace_and_so_do_stale_progress_records(boards):
    leaver, other = boards
    other.post(2, CommitReport(ok=True, digest="22" * 32, state="b2" * 32))
    left = Leaver(leaver, [other.peer_id], state_round=2, running=3, outcome_grace=0.5)
    wait_until(lambda: left.announced, 10, "the leaver to wait for round 3", poll=0.05)
    other.post(3, CommitReport())  # round 3 aborted for the others
    assert left.ended(10) and left.result == [2]
    left = Leaver(leaver, [other.peer_id], state_round=2, running=4)
    wait_until(lambda: left.announced, 10, "the leaver to wait for round 4", poll=0.05)
    left.running = 3  # the progress records of round 4 went stale: nobody computes it any more
    assert left.ended(10) and left.result == [2]


def test_the_wait_is_bounded_and_a_second_ctrl_c_ends_it(boards):
    leaver, other = boards
    other.post(2, CommitReport(ok=True, digest="22" * 32, state="b2" * 32))
    left = Leaver(leaver, [other.peer_id], state_round=2, running=3, limit=1.0)
    assert left.ended(10) and left.result == [2]  # nobody ever posts round 3
    left = Leaver(leaver, [other.peer_id], state_round=2, running=3)  # 30 s by default
    wait_until(lambda: left.announced, 10, "the leaver to wait again", poll=0.05)
    left.stop.set()
    assert left.ended(5) and left.result == [2]
