"""The cross-cohort tree's plan: every leader computes the same bounded groups from the roster alone."""

from __future__ import annotations

import itertools

import pytest

from peer.averaging.cross_tree import TreeGroup, cross_groups, units_for_majority, units_of


@pytest.mark.parametrize("fanout", [2, 3, 8])
@pytest.mark.parametrize("num_cohorts", [2, 5, 8, 9, 16, 17, 64, 100])
def test_every_group_is_bounded_and_all_cohorts_meet_in_one_top_group(num_cohorts: int, fanout: int):
    paths = [cross_groups(rank, num_cohorts, fanout) for rank in range(num_cohorts)]
    depth = len(paths[0])
    assert all(len(p) == depth for p in paths), "every leader climbs the same number of levels"
    assert fanout ** (depth - 1) < num_cohorts <= fanout**depth, "no level more than the fanout needs"
    units = num_cohorts
    for level in range(depth):
        members: dict[int, set[int]] = {}  # group index -> the units (groups below) that meet in it
        for rank, path in enumerate(paths):
            below = path[level - 1].index if level else rank
            members.setdefault(path[level].index, set()).add(below)
        assert set().union(*members.values()) == set(range(units)), "every unit belongs to one group"
        sizes = [len(m) for m in members.values()]
        assert max(sizes) <= fanout and max(sizes) - min(sizes) <= 1, sizes
        for path in paths:  # each leader is told its group's true size
            assert path[level].size == len(members[path[level].index])
            assert path[level].level == level + 1
        units = len(members)
    assert units == 1 and {p[-1] for p in paths} == {TreeGroup(depth, 0, paths[0][-1].size)}


def test_few_cohorts_meet_flat_and_one_cohort_meets_nobody():
    assert cross_groups(0, 1) == []
    assert cross_groups(3, 8, fanout=8) == [TreeGroup(1, 0, 8)]
    assert cross_groups(4, 5, fanout=2) == [TreeGroup(1, 2, 1), TreeGroup(2, 1, 1), TreeGroup(3, 0, 2)]


@pytest.mark.parametrize("rank, cohorts, fanout", [(-1, 4, 2), (4, 4, 2), (0, 4, 1)])
def test_an_impossible_plan_is_refused(rank: int, cohorts: int, fanout: int):
    with pytest.raises(ValueError):
        cross_groups(rank, cohorts, fanout)


@pytest.mark.parametrize("fanout", [2, 3, 8])
@pytest.mark.parametrize("num_cohorts", [2, 5, 9, 17, 64])
def test_a_groups_units_hold_exactly_the_cohorts_that_climb_through_it(num_cohorts: int, fanout: int):
    for rank in range(num_cohorts):
        for level, group in enumerate(cross_groups(rank, num_cohorts, fanout), start=1):
            units = units_of(group, num_cohorts, fanout)
            assert len(units) == group.size, "one unit per member the group expects"
            assert any(rank in unit for unit in units)
            climbing = {
                r for r in range(num_cohorts) if cross_groups(r, num_cohorts, fanout)[level - 1] == group
            }
            assert sorted(r for unit in units for r in unit) == sorted(climbing)
            # a unit is one cohort at level 1, one whole group of the level below higher up
            for unit in units:
                below = {cross_groups(r, num_cohorts, fanout)[level - 2] if level > 1 else r for r in unit}
                assert len(below) == 1


@pytest.mark.parametrize(
    "sizes, roster, least",
    [
        ([4] * 8, 32, 5),  # 4 groups of 4 are half: a tie, no commit
        ([4, 4], 8, 2),
        ([5, 1, 1, 1], 8, 2),  # the large cohort and any other are a majority
        ([1, 1, 1, 1], 4, 3),
        ([1, 1], 2, 2),
        ([], 32, 2),  # the cohorts' peers unknown: any group may form
        ([2, 2], 9, 3),  # the roster holds peers no unit carries: even all units are no majority
    ],
)
def test_a_top_group_needs_the_units_of_a_majority(sizes: list[int], roster: int, least: int):
    assert units_for_majority(sizes, roster) == least


@pytest.mark.parametrize("sizes", [[4] * 8, [5, 1, 1, 1], [3, 2, 2, 1, 1], [1] * 7])
def test_every_group_of_the_least_size_or_more_may_hold_a_majority_and_no_smaller_one_can(sizes: list[int]):
    roster = sum(sizes)
    least = units_for_majority(sizes, roster)
    for count in range(1, len(sizes) + 1):
        best = max(sum(c) for c in itertools.combinations(sizes, count))
        assert (2 * best > roster) == (count >= least) or count < 2
