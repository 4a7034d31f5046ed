"""Matchmaking reads a stage's group key at once; a pair reads it soon again (partners mostly arrive
together), then ever less often while nobody comes, at most :data:`GROUP_KEY_READ_SPACING` apart."""

from __future__ import annotations

import pytest

from hivemind_adapter.allreduce import GROUP_KEY_FIRST_REREAD, GROUP_KEY_READ_SPACING, GroupKeyReadPace


def _reads(pace: GroupKeyReadPace, key: str, start: float, count: int) -> list[float]:
    """When ``count`` back-to-back reads of ``key`` from ``start`` happen (each asked as soon as the
    last one was made)."""
    times, now = [], start
    for _ in range(count):
        now += pace.wait_before(key, now)
        times.append(now)
    return times


def test_a_new_key_is_read_at_once_then_soon_then_at_doubling_gaps_up_to_the_spacing():
    pace = GroupKeyReadPace()
    times = _reads(pace, "stage-a", 100.0, 8)
    gaps = [later - earlier for earlier, later in zip(times, times[1:])]
    assert times[0] == 100.0
    assert gaps[0] == pytest.approx(GROUP_KEY_FIRST_REREAD)
    assert gaps[1:] == pytest.approx([min(2 * g, GROUP_KEY_READ_SPACING) for g in gaps[:-1]])
    assert gaps[-1] == pytest.approx(GROUP_KEY_READ_SPACING)
    # two seconds of waiting cost 8 reads, against 100 at the first gap's pace
    assert sum(1 for t in _reads(GroupKeyReadPace(), "k", 0.0, 100) if t <= 2.0) == 8


def test_the_next_stages_key_is_read_at_once_and_a_late_caller_does_not_wait():
    pace = GroupKeyReadPace()
    last = _reads(pace, "stage-a", 0.0, 6)[-1]
    assert pace.wait_before("stage-b", last + 0.01) == 0.0  # a new key: partners may be waiting already
    assert pace.wait_before("stage-b", last + 0.01) == pytest.approx(GROUP_KEY_FIRST_REREAD)
    assert pace.wait_before("stage-b", last + 5.0) == 0.0  # its gap passed long ago


def test_a_larger_group_reads_its_key_at_the_full_spacing_from_the_first_read():
    """Early reads see some of the leaders that declared together; members joining different ones
    would split the group, so only a pair reads its key again soon."""
    pace = GroupKeyReadPace()
    now = 0.0
    times = []
    for _ in range(4):
        now += pace.wait_before("stage-of-four", now, pair=False)
        times.append(now)
    assert times == pytest.approx(
        [0.0, GROUP_KEY_READ_SPACING, 2 * GROUP_KEY_READ_SPACING, 3 * GROUP_KEY_READ_SPACING]
    )
