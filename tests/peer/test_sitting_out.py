"""Sitting an attempt out on a real DHT's signed commit board (peer.catch_up).

A newcomer sits out the attempt in progress (whose rosters may lack it; at a round's end it looks a
few seconds for the next), and a peer found behind the swarm the attempt it left, until the swarm
ended it: its state committed, or no result able to commit any more. Then it starts the next attempt
with the swarm, never one the swarm has not reached.
"""

from __future__ import annotations

import threading
import time

import pytest

from hivemind_adapter.dht import speaker
from peer.catch_up import await_attempt_end, sit_out_running_attempt, swarm_runs_round
from peer.commit.boards import SignedCommitBoard
from peer.commit.report import CommitReport
from peer.swarm_view import PROGRESS_TTL
from protocol.identity import Identity
from tests.helpers import progress_readers, two_task_dhts, wait_until

TASK = "digits-sit-out-test"
KILLED = "QmKilledPeerThatNeverReports"


@pytest.fixture
def two_boards():
    with two_task_dhts(TASK) as dhts:
        yield [SignedCommitBoard(d, TASK, speaker(d, Identity.generate())) for d in dhts]


def _in_thread(target) -> tuple[threading.Thread, list]:
    result: list = []
    thread = threading.Thread(target=lambda: result.append(target()), daemon=True)
    thread.start()
    return thread, result


def _sitting_out(board, others, **timing):
    """Run :func:`sit_out_running_attempt` in a thread: (thread, its result, the attempts it announced, its
    stop event)."""
    announced, stop = [], threading.Event()
    thread, result = _in_thread(
        lambda: sit_out_running_attempt(board, others, stop, announced.append, **timing)
    )
    return thread, result, announced, stop


def test_a_newcomer_joins_a_forming_swarm_at_once_and_posts_nothing(two_boards):
    newcomer, peer = two_boards
    stop = threading.Event()
    roster = [peer.peer_id]
    assert sit_out_running_attempt(newcomer, roster, stop) is None  # nothing committed yet
    peer.post(
        0, CommitReport(ok=True, digest="11" * 32)
    )  # a result, but no state a quorum holds: still forming
    assert sit_out_running_attempt(newcomer, roster, stop) is None
    assert newcomer.peer_id not in newcomer.read(1) and newcomer.peer_id not in newcomer.read(0)


def test_a_newcomer_sits_out_the_attempt_in_progress_until_its_state_is_committed(two_boards):
    newcomer, peer = two_boards
    peer.post(
        0, CommitReport(ok=True, digest="11" * 32, state="aa" * 32)
    )  # the swarm committed attempt 0; attempt 1 runs
    thread, result, announced, _ = _sitting_out(newcomer, [peer.peer_id], outcome_grace=60.0)
    wait_until(lambda: announced, 15, "the newcomer to say which attempt it sits out", poll=0.05)
    assert announced == [1]
    report = peer.read(1).get(newcomer.peer_id)
    assert report is not None and report.left, report  # out of attempt 1's quorum where a roster holds it
    assert peer.latest_attempt() == 0  # and the notice does not move the swarm's attempt counter
    thread.join(1.5)
    assert thread.is_alive(), "stopped waiting before attempt 1 ended"
    peer.post(1, CommitReport(ok=True, digest="22" * 32))
    thread.join(1.5)
    assert thread.is_alive(), "a posted result is not yet a committed state (its grace is 60 s here)"
    peer.post(1, CommitReport(ok=True, digest="22" * 32, state="bb" * 32))
    thread.join(10)
    assert not thread.is_alive() and result == [1]


def test_a_newcomer_arriving_as_the_swarm_ends_an_attempt_sits_out_that_one_not_the_next(two_boards):
    """Some peers posted their reports of the attempt and the others are finishing it: that attempt
    is the one running. Taking it for ended, a newcomer sat out the next one too, a whole round it
    was in every roster of (16 full peers with churn: joiners took 395 s to contribute)."""
    newcomer, peer = two_boards
    peer.post(0, CommitReport(ok=True, digest="11" * 32, state="aa" * 32))
    peer.post(1, CommitReport(ok=True, digest="22" * 32))  # attempt 1's result; its state not shown yet
    wait_until(lambda: newcomer.latest_attempt() == 1, 15, "attempt 1's result to show", poll=0.05)
    thread, result, announced, _ = _sitting_out(newcomer, [peer.peer_id], outcome_grace=60.0)
    wait_until(lambda: announced, 15, "the newcomer to say which attempt it sits out", poll=0.05)
    assert announced == [1]
    peer.post(1, CommitReport(ok=True, digest="22" * 32, state="bb" * 32))
    thread.join(10)
    assert not thread.is_alive() and result == [1]  # it takes part in attempt 2, with the swarm


def test_a_result_a_quorum_holds_is_waited_on_until_its_state_shows(two_boards):
    """In a churn run the first result (a cohort's abort) came 2 s before the quorum's commits, whose
    state reports took longer still: a peer behind ended its wait 5 s after the first result, found
    no newer state, and computed the round the swarm had just committed."""
    newcomer, peer = two_boards
    newcomer.post(1, CommitReport.departure())
    peer.post(1, CommitReport(ok=True, digest="22" * 32))  # a quorum of [peer] holds it; no state yet
    stop = threading.Event()
    thread, result = _in_thread(
        lambda: await_attempt_end(newcomer, [peer.peer_id], 1, stop, outcome_grace=0.5)
    )
    thread.join(3.0)  # six times its grace
    assert thread.is_alive(), "the wait ended before the committed result's state showed"
    peer.post(1, CommitReport(ok=True, digest="22" * 32, state="bb" * 32))
    thread.join(10)
    assert not thread.is_alive() and result == [None]


def test_a_partners_checking_marker_does_not_end_a_newcomers_sit_out(two_boards):
    """Groups of three post markers in the middle of an attempt. Taken for the attempt's first result,
    one ended the sit-out 5 s later, before the commit: the red team's late joiner then ran the
    attempt after with a state one round old and never committed (0 rounds in 4 minutes)."""
    newcomer, peer = two_boards
    peer.post(0, CommitReport(ok=True, digest="11" * 32, state="aa" * 32))
    thread, result, announced, _ = _sitting_out(newcomer, [peer.peer_id], outcome_grace=1.0)
    wait_until(lambda: announced, 15, "the newcomer to sit out attempt 1", poll=0.05)
    peer.post(1, CommitReport(checked=("cc" * 32,), checking=True))
    wait_until(lambda: peer.peer_id in newcomer.read_checks(1), 15, "the marker to show", poll=0.05)
    assert newcomer.latest_attempt() == 0
    thread.join(3.0)  # three times its grace after a result
    assert thread.is_alive(), "a marker ended the sit-out as if attempt 1 had a result"
    peer.post(1, CommitReport(ok=True, digest="22" * 32, state="bb" * 32))
    thread.join(10)
    assert not thread.is_alive() and result == [1]


def test_after_an_aborted_attempt_the_newcomer_starts_the_next_one_with_the_swarm(two_boards):
    """Not once the next attempt is over: that would put it a whole attempt out of step for good."""
    newcomer, peer = two_boards
    peer.post(0, CommitReport(ok=True, digest="11" * 32, state="aa" * 32))
    thread, result, announced, _ = _sitting_out(newcomer, [peer.peer_id], outcome_grace=1.0)
    wait_until(lambda: announced, 15, "the newcomer to sit out attempt 1", poll=0.05)
    peer.post(1, CommitReport())  # attempt 1 aborted; its peers go on to attempt 2
    thread.join(15)
    assert not thread.is_alive() and result == [1]
    assert peer.latest_attempt() == 1  # nobody posted attempt 2: the newcomer takes part in it


def test_sitting_out_is_bounded_and_ends_on_stop(two_boards):
    newcomer, peer = two_boards
    peer.post(0, CommitReport(ok=True, digest="11" * 32, state="aa" * 32))
    thread, result, _, _ = _sitting_out(newcomer, [peer.peer_id], limit=1.0)
    thread.join(15)  # nobody ever posts attempt 1
    assert not thread.is_alive() and result == [1]
    thread, result, announced, stop = _sitting_out(newcomer, [peer.peer_id])  # 180 s by default
    wait_until(lambda: announced, 15, "the newcomer to sit out again", poll=0.05)
    stop.set()  # Ctrl-C
    thread.join(15)
    assert not thread.is_alive() and result == [1]


def test_a_first_result_does_not_end_a_sit_out_while_a_late_quorum_can_still_form(two_boards):
    """With churn, one peer's result came 40 s before the rest of its quorum's. Ending 5 s after it,
    a newcomer began the next attempt with the old state while the swarm committed this one: it
    computed a round the swarm had finished and sat out the next attempt too."""
    newcomer, peer = two_boards
    others = [peer.peer_id, KILLED]  # a quorum of these two needs both
    newcomer.post(1, CommitReport.departure())
    peer.post(1, CommitReport(ok=True, digest="22" * 32))  # the first result: the other could still hold it
    stop = threading.Event()
    thread, result = _in_thread(lambda: await_attempt_end(newcomer, others, 1, stop, outcome_grace=0.5))
    thread.join(3.0)  # six times its grace
    assert thread.is_alive(), "the wait ended while attempt 1 could still commit"
    stop.set()
    thread.join(15)
    assert not thread.is_alive() and result == [None]


def test_an_undecided_attempt_ends_the_wait_once_its_missing_peers_leave_the_roster(two_boards):
    newcomer, peer = two_boards
    others = [peer.peer_id, KILLED]
    peer.post(1, CommitReport(ok=True, digest="22" * 32))  # the killed peer will never hold it too
    online = [peer.peer_id, newcomer.peer_id, KILLED]
    stop = threading.Event()
    thread, result = _in_thread(
        lambda: await_attempt_end(newcomer, others, 1, stop, online=lambda: list(online), outcome_grace=0.5)
    )
    thread.join(3.0)
    assert thread.is_alive(), "ended while the roster still held a peer that could make the quorum"
    online.remove(KILLED)  # its announcement expired
    thread.join(15)  # the roster is read again within 5 s
    assert not thread.is_alive() and result == [None]
    stop.set()


def test_an_attempt_that_never_decides_ends_the_wait_after_its_first_result(two_boards):
    newcomer, peer = two_boards
    peer.post(1, CommitReport(ok=True, digest="22" * 32))
    stop = threading.Event()
    thread, result = _in_thread(
        lambda: await_attempt_end(
            newcomer, [peer.peer_id, KILLED], 1, stop, outcome_grace=0.5, undecided_grace=2.0
        )
    )
    thread.join(15)
    assert not thread.is_alive() and result == [None]
    stop.set()


def test_a_peer_behind_the_swarm_waits_until_the_swarm_commits_the_attempt_it_left(two_boards):
    """It sat out attempt 5, which the swarm still runs. Computing at once, it would post for attempt 6
    first, and every peer's next attempt would skip past 6: the swarm split over two attempt numbers."""
    behind, peer = two_boards
    peer.post(4, CommitReport(ok=True, digest="11" * 32, state="aa" * 32))
    behind.post(5, CommitReport.departure())
    stop = threading.Event()
    thread, result = _in_thread(lambda: await_attempt_end(behind, [peer.peer_id], 5, stop))
    thread.join(2.0)
    assert thread.is_alive(), "stopped waiting before the swarm ended attempt 5"
    peer.post(5, CommitReport(ok=True, digest="22" * 32, state="bb" * 32))
    thread.join(15)
    assert not thread.is_alive() and result == [None]
    assert behind.latest_attempt() == 5  # the attempt it starts next is the swarm's
    stop.set()


@pytest.fixture
def two_progress_readers():
    with progress_readers(TASK) as readers:
        yield readers


def test_a_newcomer_between_two_rounds_sees_the_swarm_begin_the_next(two_progress_readers):
    """At a round's commit the swarm's records of it may have expired (its averaging outlasts them)
    and the next round's are seconds away: a newcomer that looked once took the swarm for idle,
    computed the round alone, and found itself behind the swarm."""
    worker, newcomer = two_progress_readers
    stop = threading.Event()

    def latest() -> int:
        return newcomer.swarm_round(fresh_ms=int(PROGRESS_TTL * 1000))

    assert latest() == -1  # between two rounds: nothing fresh
    looking, answer = _in_thread(lambda: swarm_runs_round(latest, 3, stop, settle=20.0))
    time.sleep(2.0)
    worker.begin(3, "cohort-a", state_round=2)
    worker.look(8, 1.0)  # its first record of round 3, published at once
    looking.join(25)
    assert answer == [True]


def test_a_newcomer_takes_a_quiet_swarm_for_idle_after_the_settle(two_progress_readers):
    worker, newcomer = two_progress_readers
    worker.begin(2, "cohort-a", state_round=1)
    worker.look(8, 1.0)  # a record of the round the newcomer already holds
    wait_until(lambda: newcomer.swarm_round() == 2, 15, "the newcomer to see round 2", poll=0.2)
    started = time.monotonic()
    assert not swarm_runs_round(lambda: newcomer.swarm_round(), 3, threading.Event(), settle=2.0)
    assert 2.0 <= time.monotonic() - started < 10.0
