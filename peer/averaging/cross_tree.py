"""Which cross-cohort groups a cohort leader meets, when there are more cohorts than one group holds.

One hivemind all-reduce group costs each member a message exchange with every other member, and it
forms only when all of them are looking at once: with a hundred cohorts, one group of a hundred
leaders is both slow to gather and fragile (any one of them late or dead breaks it). So the cohorts'
results climb a tree instead: at level 1, groups of at most ``fanout`` consecutive cohorts average;
the head of each group (one of its members) meets the heads of up to ``fanout - 1`` other groups at
level 2; and so on until one group holds everything. Every member of that top group holds the same
bytes and computes the final vector; it then travels back down the groups below (each head to the
group it led), so every leader ends with the same bytes.

Every step is an exact weighted all-reduce (weights: contributors, or cohorts in model-parallel
rounds), so the top holds the exact mean over every contributor whose group made it up; a group that
misses its level carries on with what it has, and the round's commit quorum decides which result
stands (:mod:`peer.commit.quorum`). Each leader computes the same tree from the same roster, so the
plan needs no coordination: only the heads are chosen on the way, from whoever actually came.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_FANOUT = 8  # leaders per cross-cohort group: 8 x 8 = 64 cohorts in two levels


@dataclass(frozen=True)
class TreeGroup:
    """One all-reduce group a leader's result passes through on its way up."""

    level: int  # 1: groups of cohorts; 2: groups of level-1 groups; ...
    index: int  # which group of its level (consecutive units, in cohort order)
    size: int  # how many units (cohorts, or groups of the level below) it should hold


def cross_groups(cohort_rank: int, num_cohorts: int, fanout: int = DEFAULT_FANOUT) -> list[TreeGroup]:
    """The groups, bottom up, that the leader of cohort ``cohort_rank`` (of ``num_cohorts``) passes
    through. Empty with one cohort; one group of all cohorts while they fit in ``fanout`` (a flat
    cross stage). Each level splits its units into ``ceil(units / fanout)`` groups of near-equal size,
    so no group is a lonely remainder."""
    if fanout < 2:
        raise ValueError(f"a cross-cohort group must hold at least 2 leaders, not {fanout}")
    if not 0 <= cohort_rank < num_cohorts:
        raise ValueError(f"cohort rank {cohort_rank} is outside 0..{num_cohorts - 1}")
    groups: list[TreeGroup] = []
    unit, units, level = cohort_rank, num_cohorts, 1
    while units > 1:
        count = -(-units // fanout)
        index = unit * count // units
        size = sum(1 for u in range(units) if u * count // units == index)
        groups.append(TreeGroup(level, index, size))
        unit, units, level = index, count, level + 1
    return groups


@dataclass(frozen=True)
class JoinedGroup:
    """A tree group a leader actually met: who came, and which of them carries the result on."""

    group: TreeGroup
    participants: int
    head: str  # the peer that goes up from here and brings the result back down


def units_of(group: TreeGroup, num_cohorts: int, fanout: int = DEFAULT_FANOUT) -> list[list[int]]:
    """The cohort ranks under each unit of ``group`` (a cohort at level 1, a group of the level below
    higher up), units in order: a unit all of whose peers left the attempt will not come, and the
    group need not wait for it."""
    units: dict[int, list[int]] = {}
    for rank in range(num_cohorts):
        path = cross_groups(rank, num_cohorts, fanout)
        if path[group.level - 1].index != group.index:
            continue
        unit = path[group.level - 2].index if group.level > 1 else rank
        units.setdefault(unit, []).append(rank)
    return [units[u] for u in sorted(units)]


def units_for_majority(unit_sizes: list[int], roster_size: int) -> int:
    """The fewest units (of ``unit_sizes`` roster peers each) whose peers can be more than half of
    ``roster_size``, at least 2: a top group of fewer can never hold a result that commits, and two
    such groups formed apart (a split) leave no result a majority. 2 where the sizes are unknown;
    one more than the units there are where even all of them are not enough."""
    if not unit_sizes or roster_size <= 0:
        return 2
    peers = 0
    for count, size in enumerate(sorted(unit_sizes, reverse=True), start=1):
        peers += size
        if 2 * peers > roster_size:
            return max(2, count)
    return len(unit_sizes) + 1
