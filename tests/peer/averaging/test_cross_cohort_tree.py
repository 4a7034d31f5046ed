"""The cross-cohort tree over real hivemind processes on 127.0.0.1: five cohorts in groups of two,
late and drifting leaders, fp16 down the tree."""

from __future__ import annotations

import dataclasses
import time

import pytest
import torch

from peer.averaging.factory import build_averager
from tests.peer.averaging.hierarchy_peers import (
    FAST,
    SHAPES,
    _cohorts_of_one,
    _grads,
    _outcome,
    _ranks,
    _roster,
    _run,
    assert_no_split_of_two_on_time_and_two_late,
)

pytestmark = pytest.mark.swarm


TREE = {f"t{i}": (i, 10 + i, n) for i, n in enumerate((3, 5, 2, 7, 4))}


def _tree_peer(dht, *, rank, seed, samples, rounds, fp16, run_id):
    """A cohort leader of 5 cohorts whose cross-cohort groups hold 2: a 3-level tree
    (:mod:`peer.averaging.cross_tree`). ``rounds`` is how many rounds it takes part in before it dies."""
    averager = build_averager(
        dht, run_id, f"c{rank}", [torch.zeros(s) for s in SHAPES], cross_codec="fp16" if fp16 else "none", cross_group_size=2, timeouts=FAST
    )  # fmt: skip
    try:
        roster = _roster(dht, run_id, len(TREE))
        out = []
        for r in range(rounds):
            numerator = [g * samples for g in _grads(seed)]
            res = averager.average(
                r, numerator, samples, cohort_size=1, num_cohorts=len(TREE), cohort_rank=rank, expected_peers=roster
            )  # fmt: skip
            if not res.committed:
                averager.settle(r, roster)
            out.append(_outcome(res))
        return out
    finally:
        averager.shutdown()


def _tree_args(run_id: str, fp16: bool, rounds: dict[str, int]) -> dict:
    return {
        name: dict(rank=rank, seed=seed, samples=n, rounds=rounds.get(name, 2), fp16=fp16, run_id=run_id)
        for name, (rank, seed, n) in TREE.items()
    }


def _tree_mean(names) -> list[torch.Tensor]:
    total = sum(TREE[n][2] for n in names)
    return [sum(_grads(TREE[n][1])[i] * TREE[n][2] for n in names) / total for i in range(len(SHAPES))]


def test_five_cohorts_in_groups_of_two_climb_a_tree_to_the_exact_mean_even_without_one_of_them():
    # t1 dies after round 0 and stays in every roster: in round 1 its level-1 partner t0 meets nobody
    # there and carries its own result up alone.
    results = _run(
        "hier-tree", _tree_args("hier-tree", fp16=False, rounds={"t1": 1}), _tree_peer, timeout=300
    )
    first = [results[n][0] for n in TREE]
    assert all(r["committed"] for r in first), [r["reason"] for r in first]
    assert len({r["digest"] for r in first}) == 1, "every cohort leader must hold bit-identical tensors"
    assert all(len(r["contributors"]) == 5 for r in first)
    for got, want in zip(first[0]["tensors"], _tree_mean(TREE)):
        torch.testing.assert_close(torch.from_numpy(got), want, rtol=1e-5, atol=1e-6)

    survivors = [n for n in TREE if n != "t1"]
    second = [results[n][1] for n in survivors]
    assert all(r["committed"] for r in second), [r["reason"] for r in second]
    assert len({r["digest"] for r in second}) == 1
    assert all(len(r["contributors"]) == 4 for r in second), [r["contributors"] for r in second]
    for got, want in zip(second[0]["tensors"], _tree_mean(survivors)):
        torch.testing.assert_close(torch.from_numpy(got), want, rtol=1e-5, atol=1e-6)


def _late_leader_peer(
    dht, *, rank, seed, samples, late, run_id, cohorts=3, drift=0.0, fanout=None, history=None
):
    """A cohort leader of ``cohorts`` cohorts of one that enters the cross stage ``late`` seconds after
    it could (its last mini-batch, its link or its machine held it up), with ``drift`` seconds allowed
    for the other cohorts' lag (an outer exchange's period); ``fanout``: the cross groups' size;
    ``history``: how long its earlier cross stages took (None: it has none, as a newcomer)."""
    tree = {} if fanout is None else {"cross_group_size": fanout}
    averager = build_averager(
        dht, run_id, f"c{rank}", [torch.zeros(s) for s in SHAPES], timeouts=FAST, **tree
    )
    try:
        ranked = _cohorts_of_one(dht, run_id, cohorts, rank)
        averager.deadlines.allow_drift(drift)
        if history is not None:
            averager.deadlines.record("cross", history, level=1)
        time.sleep(late)
        numerator = [g * samples for g in _grads(seed)]
        res = averager.average(
            0, numerator, samples, cohort_size=1, num_cohorts=cohorts, cohort_rank=rank,
            expected_peers=[p for (p,) in ranked], cohorts=ranked,
        )  # fmt: skip
        return _outcome(res)
    finally:
        averager.shutdown()


# Slow (`make test-all`): the default suite has a head 8 s late join the whole top group
# (test_the_top_group_waits_longer_for_a_late_head_than_a_lower_group_would).
@pytest.mark.slow
def test_a_cohort_leader_arriving_after_one_matchmaking_period_still_joins_the_whole_group():
    # Without the wait for the whole group, the two on time formed a group of their own after one
    # matchmaking period (2 s), the late one found nobody left, and the round committed without it.
    late = {"l0": (30, 3, 0.0), "l1": (31, 5, 0.0), "l2": (32, 4, 1.5 * FAST.matchmaking)}
    args = {
        name: dict(rank=rank, seed=seed, samples=n, late=delay, run_id="hier-late")
        for rank, (name, (seed, n, delay)) in enumerate(late.items())
    }
    results = _run("hier-late", args, _late_leader_peer, timeout=300)
    outcomes = [results[n] for n in late]
    assert all(r["committed"] for r in outcomes), [r["reason"] for r in outcomes]
    assert len({r["digest"] for r in outcomes}) == 1
    assert all(len(r["contributors"]) == 3 for r in outcomes), [r["contributors"] for r in outcomes]
    total = sum(n for _, n, _ in late.values())
    want = [sum(_grads(seed)[i] * n for seed, n, _ in late.values()) / total for i in range(len(SHAPES))]
    for got, expected in zip(outcomes[0]["tensors"], want):
        torch.testing.assert_close(torch.from_numpy(got), expected, rtol=1e-5, atol=1e-6)


def _heads_of_four_cohorts(
    run_id: str, late: dict[str, tuple[int, int, float]], history: dict[str, float] | None = None
) -> list[dict]:
    """The outcomes of ``len(late)`` (four) cohorts of one, ``late`` naming each head's (seed, samples,
    delay), ``history`` the earlier cross stages' seconds of those that have some."""
    history, common = history or {}, dict(run_id=run_id, cohorts=len(late))
    args = {
        name: dict(rank=rank, seed=seed, samples=n, late=delay, history=history.get(name), **common)
        for rank, (name, (seed, n, delay)) in enumerate(late.items())
    }
    results = _run(run_id, args, _late_leader_peer, timeout=300)
    return [results[n] for n in late]


# Slow (`make test-all`): the default suite holds a run of one cohort's top group to the same least
# size (test_hierarchy.py's test_in_a_run_of_one_cohort_two_members_on_time_wait_for_a_third_…).
@pytest.mark.slow
def test_two_heads_on_time_wait_for_a_third_rather_than_split_the_roster_in_halves():
    # Four cohorts of one: a result needs 3 of the 4 peers. The two on time gather for 10 s (the top
    # group's wait in a first attempt) and the other two come 12 s late. Without the top group's least
    # size the two on time averaged as a pair, the late two as another, and no result could commit
    # (measured: 2 of 4 hold it, for every peer). 32 thin peers lost a whole attempt so.
    late = {"s0": (50, 3, 0.0), "s1": (51, 5, 0.0), "s2": (52, 4, 12.0), "s3": (53, 6, 12.0)}
    assert_no_split_of_two_on_time_and_two_late(_heads_of_four_cohorts("hier-split", late))


def test_the_top_group_waits_longer_for_a_late_head_than_a_lower_group_would():
    # Four cohorts of one, one head 8 s late. The top group's result must hold a quorum, and a head
    # it starts without loses the attempt for its whole cohort, so it gathers for up to 6 matchmaking
    # periods (here 10 s: half the first attempt's deadline) rather than 3 (6 s): all four meet.
    # With 3, the three on time began at 6 s and the late one's result could not commit.
    late = {"w0": (90, 3, 0.0), "w1": (91, 5, 0.0), "w2": (92, 4, 0.0), "w3": (93, 6, 8.0)}
    outcomes = _heads_of_four_cohorts("hier-top-wait", late)
    assert all(r["committed"] for r in outcomes), [r["reason"] for r in outcomes]
    assert len({r["digest"] for r in outcomes}) == 1
    assert all(len(r["contributors"]) == 4 for r in outcomes), [r["contributors"] for r in outcomes]


def test_a_head_waits_past_its_deadline_for_late_heads_that_can_still_hold_a_quorum():
    # Four cohorts of one; three heads come 24 s late, past the first attempt's 20 s cross deadline
    # (16 full peers with churn: heads reached the top group up to 45 s apart). The one on time
    # waits on while the late ones have neither reported nor left: all four meet. Without it, it
    # gave up at 20 s and aborted, and the three late ones committed without it.
    late = {"q0": (120, 3, 0.0), "q1": (121, 5, 24.0), "q2": (122, 4, 24.0), "q3": (123, 6, 24.0)}
    outcomes = _heads_of_four_cohorts("hier-quorum-wait", late)
    assert all(r["committed"] for r in outcomes), [r["reason"] for r in outcomes]
    assert len({r["digest"] for r in outcomes}) == 1
    assert all(len(r["contributors"]) == 4 for r in outcomes), [r["contributors"] for r in outcomes]


def test_a_newcomer_head_with_a_short_wait_of_its_own_does_not_start_the_top_group_early():
    # Five cohorts of one: a result needs 3 of the 5 peers. n0 and n1 come on time with a long
    # history (their own wait: 58 s); n2, a newcomer without one (20 s), comes 3 s late; n3 and n4
    # come 22 s late. hivemind's leader is the head whose gather ends first: with each head's own
    # wait that was n2 at 20 s, with a bare quorum of three, and n3 and n4 lost the round (as heads
    # did in the 16-peer churn runs). Every head gathers to the step bound: all five meet.
    late = {f"n{i}": (130 + i, 2 + i, delay) for i, delay in enumerate((0.0, 0.0, 3.0, 22.0, 22.0))}
    history = {"n0": 18.0, "n1": 18.0, "n3": 18.0, "n4": 18.0}
    outcomes = _heads_of_four_cohorts("hier-newcomer-head", late, history)
    assert all(r["committed"] for r in outcomes), [r["reason"] for r in outcomes]
    assert len({r["digest"] for r in outcomes}) == 1
    assert all(len(r["contributors"]) == 5 for r in outcomes), [r["contributors"] for r in outcomes]


def test_a_lower_group_of_heads_waits_as_long_as_the_top_group_for_a_late_head():
    # Six cohorts of one in cross groups of three: two lower groups, then the top group of their two
    # heads. One head of the first lower group comes 8 s late. A head its lower group starts without
    # carries its cohort alone, which no quorum holds, so every group of heads gathers as long as the
    # top group (10 s here): all six commit one result. With 3 periods (6 s), 5 of 6 did.
    delays = [0.0, 0.0, 8.0, 0.0, 0.0, 0.0]
    args = {
        f"h{rank}": dict(
            rank=rank,
            seed=110 + rank,
            samples=2 + rank,
            late=delay,
            run_id="hier-lower-wait",
            cohorts=6,
            fanout=3,
        )
        for rank, delay in enumerate(delays)
    }
    outcomes = list(_run("hier-lower-wait", args, _late_leader_peer, timeout=300).values())
    assert all(r["committed"] for r in outcomes), [r["reason"] for r in outcomes]
    assert len({r["digest"] for r in outcomes}) == 1
    assert all(len(r["contributors"]) == 6 for r in outcomes), [r["contributors"] for r in outcomes]


def _pair_or_single_peer(dht, *, rank, seed, samples, late, run_id, leaves=False):
    """One of five peers in four cohorts (ranks 0-2 alone, rank 3 a pair) that averages ``late`` s
    after all five posted their ranks, or (``leaves``) posts a departure notice instead. Its stages
    wait for a group 20 s at most (the step bound, to which a top group gathers)."""
    timeouts = dataclasses.replace(FAST, step=20.0)
    averager = build_averager(dht, run_id, f"c{rank}", [torch.zeros(s) for s in SHAPES], timeouts=timeouts)
    try:
        ranks = _ranks(dht, run_id, 5, rank)
        cohorts = [tuple(sorted(p for p, r in ranks.items() if r == k)) for k in range(4)]
        if leaves:
            averager.commits.leave(0)
            return {"left": True}
        time.sleep(late)
        res = averager.average(
            0, [g * samples for g in _grads(seed)], samples, cohort_size=len(cohorts[rank]), num_cohorts=4,
            cohort_rank=rank, expected_peers=sorted(ranks), cohorts=cohorts,
        )  # fmt: skip
        return _outcome(res)
    finally:
        averager.shutdown()


def test_a_late_cohort_whose_result_cannot_hold_a_quorum_ends_without_broadcasting_it():
    # The pair comes 30 s late, past the top group's wait (the step bound, 20 s here, until which it
    # waits for every unit): the three cohorts of one commit without it (3 of 5 peers). The pair's head then
    # holds a result of 2 of 5, which can never commit: it aborts, and its member reads that on the board.
    # Before, the head broadcast the doomed result (a matchmaking and an all-reduce, seconds under
    # load), both posted it, and the pair started the next attempt late again (32 thin peers: one
    # cohort lost attempt after attempt so).
    on_time = {f"s{rank}": dict(rank=rank, seed=70 + rank, samples=2 + rank, late=0.0) for rank in range(3)}
    pair = {f"p{i}": dict(rank=3, seed=80 + i, samples=4, late=30.0) for i in range(2)}
    args = {name: dict(kw, run_id="hier-doomed") for name, kw in {**on_time, **pair}.items()}
    results = _run("hier-doomed", args, _pair_or_single_peer, timeout=300)
    committed = [results[n] for n in on_time]
    assert all(r["committed"] for r in committed), [r["reason"] for r in committed]
    assert len({r["digest"] for r in committed}) == 1 and len(committed[0]["contributors"]) == 3
    late = [results[n] for n in pair]
    assert not any(r["committed"] for r in late)
    heads = [r for r in late if "cannot hold a quorum of the 5" in r["reason"]]
    assert len(heads) == 1, [r["reason"] for r in late]
    member = next(r for r in late if r is not heads[0])
    assert member["digest"] == "", member["reason"]  # it never held the doomed result
    assert "aborted the round" in member["reason"], member["reason"]


def test_heads_on_time_that_bring_too_few_peers_for_a_quorum_wait_for_the_late_ones():
    # Five peers in four cohorts (three of one, a pair); s0 posts a departure notice, so a result
    # needs 3 of the other 4. Two units would do by count (the pair and one more), and the two cohorts
    # of one on time gather up to 17 s (their step bound less a period); the pair comes 14 s late. The two on time bring 2 of 4: their
    # group does not begin, and all three heads meet. Without the quorum gate they averaged as a
    # pair, and neither their result nor the late pair's (2 of 4 each) could commit.
    singles = {f"s{rank}": dict(rank=rank, seed=140 + rank, samples=2 + rank, late=0.0) for rank in range(3)}
    pair = {f"p{i}": dict(rank=3, seed=150 + i, samples=4, late=14.0) for i in range(2)}
    args = {name: dict(kw, run_id="hier-gate") for name, kw in {**singles, **pair}.items()}
    args["s0"]["leaves"] = True
    results = _run("hier-gate", args, _pair_or_single_peer, timeout=300)
    outcomes = [r for name, r in results.items() if name != "s0"]
    assert all(r["committed"] for r in outcomes), [r["reason"] for r in outcomes]
    assert len({r["digest"] for r in outcomes}) == 1
    assert all(len(r["contributors"]) == 4 for r in outcomes), [r["contributors"] for r in outcomes]


def _leaving_peer(dht, *, rank, run_id, cohorts):
    """A cohort of one that posts a departure notice for attempt 0 instead of taking part."""
    averager = build_averager(dht, run_id, f"c{rank}", [torch.zeros(s) for s in SHAPES], timeouts=FAST)
    try:
        _cohorts_of_one(dht, run_id, cohorts, rank)
        averager.commits.leave(0)  # stored on the nodes nearest its key, the others' included
        time.sleep(3.0)
        return dict(committed=False, reason="left", digest="", contributors=[])
    finally:
        averager.shutdown()


def test_peers_that_posted_a_departure_notice_lower_the_majority_the_top_group_needs():
    # Two of four cohorts of one leave attempt 0: the quorum counts the two that stay, so their pair
    # may form and commit (held to a majority of all four, it could not).
    args = {
        "s0": dict(rank=0, seed=60, samples=3, late=0.0, run_id="hier-notice", cohorts=4),
        "s1": dict(rank=1, seed=61, samples=5, late=0.0, run_id="hier-notice", cohorts=4),
    }
    leaving = {f"s{rank}": dict(rank=rank, run_id="hier-notice", cohorts=4) for rank in (2, 3)}
    results = _run("hier-notice", {**args, **leaving}, _late_or_leaving_peer, timeout=300)
    stayers = [results[n] for n in args]
    assert all(r["committed"] for r in stayers), [r["reason"] for r in stayers]
    assert len({r["digest"] for r in stayers}) == 1
    assert all(len(r["contributors"]) == 2 for r in stayers)


def _late_or_leaving_peer(dht, **kwargs):
    return _late_leader_peer(dht, **kwargs) if "seed" in kwargs else _leaving_peer(dht, **kwargs)


# Slow (27 s, `make test-all`: a head waits out 25 s): the default suite checks the allowance's waits
# (tests/peer/averaging/test_deadlines.py) and the tree itself (above).
@pytest.mark.slow
def test_a_cohort_a_period_behind_still_meets_the_other_when_its_drift_is_allowed():
    """Cohorts run their inner steps at their own pace, so their heads reach an outer exchange apart.
    One 25 s late is past the cross stage's first wait (10 matchmaking periods, 20 s): without a drift
    allowance the head on time went on alone, the late one too, and neither result had a quorum
    (measured, drift 0: "no quorum for this result: 1 of 2 roster peer(s) hold it" after 45 s). Allowed a
    40 s period, both take the exact mean."""
    late = {"d0": (40, 3, 0.0), "d1": (41, 5, 25.0)}
    args = {
        name: dict(rank=rank, seed=seed, samples=n, late=delay, run_id="hier-drift", cohorts=2, drift=40.0)
        for rank, (name, (seed, n, delay)) in enumerate(late.items())
    }
    results = _run("hier-drift", args, _late_leader_peer, timeout=300)
    outcomes = [results[n] for n in late]
    assert all(r["committed"] for r in outcomes), [r["reason"] for r in outcomes]
    assert len({r["digest"] for r in outcomes}) == 1
    assert outcomes[0]["seconds"]["cross"] > 20.0  # it waited past the first wait for the late head
    total = sum(n for _, n, _ in late.values())
    want = [sum(_grads(seed)[i] * n for seed, n, _ in late.values()) / total for i in range(len(SHAPES))]
    for got, expected in zip(outcomes[0]["tensors"], want):
        torch.testing.assert_close(torch.from_numpy(got), expected, rtol=1e-5, atol=1e-6)


def test_an_fp16_tree_brings_every_leader_the_same_bytes():
    # The way down crosses fp16 wires: only values already in fp16 cross them unchanged.
    results = _run(
        "hier-tree16", _tree_args("hier-tree16", fp16=True, rounds={n: 1 for n in TREE}), _tree_peer
    )
    rounds = [results[n][0] for n in TREE]
    assert all(r["committed"] for r in rounds), [r["reason"] for r in rounds]
    assert len({r["digest"] for r in rounds}) == 1, "compression must not make leaders differ"
    for got, want in zip(rounds[0]["tensors"], _tree_mean(TREE)):
        torch.testing.assert_close(torch.from_numpy(got), want, rtol=2e-3, atol=2e-3)


# ---------------------------------------------------------------- a member lost inside the all-reduce
