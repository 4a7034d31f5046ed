"""A commit wait reads the board again soon after its first read, often while reports arrive and
ever less often while none does, never sleeping past its deadline."""

from __future__ import annotations

import time

from peer.commit.waits import (
    COMMIT_FIRST_REREAD_SECONDS,
    COMMIT_POLL_MAX_SECONDS,
    COMMIT_POLL_SECONDS,
    ReadPace,
)


def test_reads_slow_down_while_nothing_new_arrives_and_speed_up_when_something_does():
    pace = ReadPace(time.monotonic() + 3600)
    assert pace.next_interval(frozenset({"a"})) == COMMIT_FIRST_REREAD_SECONDS < COMMIT_POLL_SECONDS
    assert pace.next_interval(frozenset({"a"})) == COMMIT_POLL_SECONDS  # then the usual pace
    quiet = [pace.next_interval(frozenset({"a"})) for _ in range(12)]
    assert all(later > earlier for earlier, later in zip(quiet, quiet[1:5]))  # growing
    assert quiet[-1] == COMMIT_POLL_MAX_SECONDS  # up to the cap, not past it
    assert pace.next_interval(frozenset({"a", "b"})) == COMMIT_POLL_SECONDS  # a new report: read soon


def test_a_wait_never_sleeps_past_its_deadline():
    pace = ReadPace(time.monotonic() + 0.05)
    for _ in range(10):
        pace.next_interval()
    assert pace.next_interval() <= 0.05
    time.sleep(0.06)
    assert pace.next_interval() == 0.0


def test_reads_on_a_board_that_stays_silent_for_ten_seconds_are_a_fraction_of_a_fixed_pace():
    """What the pace saves: a ten-second wait on a silent board reads it about 16 times, not 100."""
    pace = ReadPace(time.monotonic() + 3600)
    waited, reads = 0.0, 0
    while waited < 10.0:
        waited += pace.next_interval(frozenset())
        reads += 1
    assert reads <= 20
    assert reads < 10.0 / COMMIT_POLL_SECONDS / 4
