"""A top group whose all-reduce broke meets again without the member it lost, though its members
began their stage at different times (real hivemind processes on 127.0.0.1)."""

from __future__ import annotations

import time

import pytest
import torch

from peer.averaging.factory import build_averager
from peer.averaging.stage import AveragingTimeouts
from tests.peer.averaging.hierarchy_peers import (
    SHAPES,
    _cohorts_of_one,
    _grads,
    _outcome,
    _run,
    average_as_cohort_of_one,
)
from tests.peer.averaging.test_stage_failures import _arm, _KilledInAnAllReduce

pytestmark = pytest.mark.swarm

# The top group of three cohorts of one waits 20 s from each head's arrival (step); periods of 3 s.
TIMEOUTS = AveragingTimeouts(
    matchmaking=3.0, request=1.0, next_chunk=5.0, allreduce=60.0, step=20.0, commit=30.0
)


def _head(dht, *, rank, seed, samples, late, regroup_delay, victim, run_id):
    """A cohort of one whose head enters the cross stage ``late`` seconds after the others posted
    their ids, and after a broken all-reduce looks for its group again only ``regroup_delay``
    seconds later (a loaded machine); the victim dies as its first all-reduce starts."""
    averager = build_averager(
        dht, run_id, f"c{rank}", [torch.zeros(s) for s in SHAPES], timeouts=TIMEOUTS,
        averager_type=_KilledInAnAllReduce,
    )  # fmt: skip
    try:
        ranked = _cohorts_of_one(dht, run_id, 3, rank)
        if victim:
            _arm(dht)
        if regroup_delay:
            told = averager.stages.on_broken

            def slow_to_regroup() -> None:
                told()
                time.sleep(regroup_delay)

            averager.stages.on_broken = slow_to_regroup
        time.sleep(late)
        res = average_as_cohort_of_one(averager, rank, ranked, seed, samples)
        return dict(_outcome(res), regrouped=res.regrouped)
    finally:
        averager.shutdown()


def test_heads_that_arrived_apart_regroup_after_a_broken_all_reduce_in_one_window(tmp_path, monkeypatch):
    # h0 enters the cross stage at once; h1 and the victim 13 s later, and the group of three begins.
    # The victim dies in that all-reduce. h0's own 20 s wait then ends within about 7 s, and h1, slow,
    # looks again 9 s after the break: in the churn run at fb193e3 the heads that had arrived first
    # gave up 4 s after such a break, and every peer's round aborted. Both survivors now look for
    # each other for 5 periods from the break, and commit the mean of their two contributions.
    monkeypatch.setattr(_KilledInAnAllReduce, "armed", str(tmp_path / "armed"))
    monkeypatch.setattr(_KilledInAnAllReduce, "at", 1)
    heads = {"h0": (40, 3, 0.0, 0.0, False), "h1": (41, 5, 13.0, 9.0, False), "h2": (42, 4, 13.0, 0.0, True)}
    args = {
        name: dict(
            rank=rank, seed=seed, samples=n, late=late, regroup_delay=delay, victim=victim, run_id="regroup"
        )
        for rank, (name, (seed, n, late, delay, victim)) in enumerate(heads.items())
    }
    results = _run("regroup", args, _head, timeout=300)
    assert results["h2"] is None, "the victim reported: it was not killed"
    survivors = [results["h0"], results["h1"]]
    assert all(r["regrouped"] == ["cross"] for r in survivors), [
        (r["regrouped"], r["reason"]) for r in survivors
    ]
    assert all(r["committed"] for r in survivors), [(r["reason"], r["seconds"]) for r in survivors]
    assert survivors[0]["digest"] == survivors[1]["digest"]
    want = [(_grads(40)[i] * 3 + _grads(41)[i] * 5) / 8 for i in range(len(SHAPES))]
    for got, expected in zip(survivors[0]["tensors"], want):
        torch.testing.assert_close(torch.from_numpy(got), expected, rtol=1e-5, atol=1e-6)
