"""Stage deadlines follow what recent rounds took, within their floor and ceiling."""

from __future__ import annotations

import pytest

from peer.averaging.deadlines import StageDeadlines


def test_a_stage_without_history_waits_the_initial_time_within_the_ceiling():
    assert StageDeadlines(2.0, 60.0).deadline("cohort").seconds == 20.0  # ten matchmaking periods
    assert StageDeadlines(2.0, 15.0).deadline("cohort").seconds == 15.0
    assert StageDeadlines(2.0, 60.0, initial=7.0).deadline("cohort").slowest_recent is None


def test_a_first_broadcast_also_waits_out_the_heads_cross_stage():
    """A member enters the broadcast as its head enters the cross stage: before any broadcast was
    timed, its wait is the cross stage's and the broadcast's own."""
    d = StageDeadlines(2.0, 20.0)
    assert d.deadline("broadcast").seconds == 40.0  # two initial waits, each within the ceiling
    d.record("cross", 2.0)
    assert d.deadline("broadcast").seconds == 20.0 + 3 * 2.0 + 2 * 2.0  # the cross stage's own deadline
    d.record("broadcast", 9.0)  # a timed broadcast holds the head's climb: its own history only
    assert d.deadline("broadcast").seconds == 20.0


def test_a_deadline_is_a_multiple_of_the_slowest_recent_stage_plus_two_matchmaking_periods():
    d = StageDeadlines(2.0, 60.0)
    for seconds in (1.0, 3.0, 2.0):
        d.record("cross", seconds)
    chosen = d.deadline("cross")
    assert chosen.seconds == pytest.approx(3 * 3.0 + 2 * 2.0)
    assert chosen.slowest_recent == 3.0
    assert "up to 3.0 s" in chosen.describe()


def test_a_tree_level_that_met_before_waits_as_its_own_history_says():
    # A head that climbs to the top waited 5 s there for the slowest cohorts; at level 1 its groups
    # formed in 0.4 s. Timed by the top's 5 s it would wait 19 s at level 1, longer than its level-2
    # partner (its own level 1 as fast) waits for it there: 2 x 6 s.
    d = StageDeadlines(2.0, 60.0)
    d.record("cross", 0.4, level=1)
    d.record("cross", 5.0, level=3)
    assert d.deadline("cross", level=1).seconds == 6.0  # the floor: 3 x 0.4 + 4 is less
    assert d.deadline("cross", level=3).seconds == pytest.approx(3 * 5.0 + 2 * 2.0)
    assert d.deadline("cross", level=2).seconds == pytest.approx(3 * 5.0 + 2 * 2.0)  # unmet: every level's
    assert d.deadline("cross").seconds == pytest.approx(3 * 5.0 + 2 * 2.0)  # the stage as a whole


def test_a_deadline_stays_between_three_matchmaking_periods_and_the_ceiling():
    d = StageDeadlines(2.0, 30.0)
    d.record("cohort", 0.01)
    assert d.deadline("cohort").seconds == 6.0
    d.record("broadcast", 100.0)
    assert d.deadline("broadcast").seconds == 30.0
    assert d.deadline("broadcast", ceiling=20.0).seconds == 20.0


def test_only_the_last_rounds_count():
    d = StageDeadlines(1.0, 60.0)
    d.record("cohort", 10.0)
    for _ in range(8):
        d.record("cohort", 1.0)  # the slow round has left the history
    assert d.deadline("cohort").slowest_recent == 1.0


def test_an_attempt_lasts_the_stages_seen_with_each_tree_level_crossed_and_broadcast_again():
    d = StageDeadlines(1.0, 60.0)
    assert d.total() == 10.0  # nothing seen yet: the initial wait
    d.record("cohort", 2.0)  # deadline 8
    d.record("cross", 4.0)  # 14
    d.record("broadcast", 1.0)  # 5
    d.record("commit", 0.1)  # 3 (the floor)
    assert d.total() == pytest.approx(8 + 14 + 5 + 3)
    # three levels: a member's broadcast waits for its leader's climb up three groups and back
    assert d.total(levels=3) == pytest.approx(8 + 3 * 14 + 3 * 5 + 3)


def test_an_all_reduce_may_run_a_multiple_of_its_stages_recent_time_above_the_drop_out_limit():
    d = StageDeadlines(2.0, 60.0)
    assert d.allreduce_bound("broadcast", 120.0, least=20.0) == 120.0  # no history: the ceiling
    d.record("broadcast", 10.1)
    assert d.allreduce_bound("broadcast", 120.0, least=20.0) == 35.0  # ceil(3 x 10.1 + 2 x 2)
    d.record("cohort", 0.5)
    assert d.allreduce_bound("cohort", 120.0, least=20.0) == 20.0  # never below hivemind's drop-out limit
    d.record("cross", 50.0)
    # above the step timeout (60 s, the wait for a group), within the all-reduce's own ceiling
    assert d.allreduce_bound("cross", 120.0, least=20.0) == 120.0
    assert d.allreduce_bound("cross", 200.0, least=20.0) == 154.0


def test_a_drift_allowance_lengthens_only_the_waits_for_other_cohorts_above_the_ceiling():
    """An outer exchange allows the other cohorts a period's lag: the cross stage and the
    broadcast (which waits for the head's cross stage) wait that much longer, even past the step
    timeout; the cohort stage and the commit do not."""
    d = StageDeadlines(2.0, 60.0)
    d.record("cross", 30.0)  # 3 x 30 + 4 = 94: capped at 60
    d.allow_drift(45.0)
    assert d.deadline("cross").seconds == 60.0 + 45.0
    assert d.deadline("cross").drift == 45.0
    assert "45.0 s of it for the cohorts' drift" in d.deadline("cross").describe()
    # its own initial wait, the head's climb, the drift
    assert d.deadline("broadcast").seconds == 20.0 + 60.0 + 45.0
    assert d.deadline("cohort").seconds == 20.0
    assert d.deadline("commit", ceiling=20.0).seconds == 20.0
    d.allow_drift(0.0)
    assert d.deadline("cross").seconds == 60.0 and d.deadline("cross").drift == 0.0
