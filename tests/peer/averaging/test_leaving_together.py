"""Peers stopped together finish their round: a leaving head that knows its cross stage's partners
waits for the ones still on their way (real hivemind processes on 127.0.0.1)."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest
import torch

from peer.averaging.factory import build_averager
from peer.averaging.stage import LEAVING_GRACE_FACTOR
from tests.peer.averaging import hierarchy_peers as peers

pytestmark = pytest.mark.swarm

# The top group of three cohorts of one waits 30 s from each head's arrival (step); periods of 3 s.
TIMEOUTS = replace(peers.FAST, matchmaking=3.0, step=30.0)
LATE = 4 * TIMEOUTS.matchmaking  # past a leaving peer's grace of LEAVING_GRACE_FACTOR periods


def _leaving_head(dht, *, rank, seed, samples, late, run_id):
    """A cohort of one, already leaving (stopped with the others), whose head enters the cross stage
    ``late`` seconds after all three posted their ids."""
    averager = build_averager(
        dht,
        run_id,
        f"c{rank}",
        [torch.zeros(s) for s in peers.SHAPES],
        timeouts=TIMEOUTS,
        leaving=lambda: True,
    )
    try:
        ranked = peers._cohorts_of_one(dht, run_id, 3, rank)
        time.sleep(late)
        res = peers.average_as_cohort_of_one(averager, rank, ranked, seed, samples)
        return peers._outcome(res)
    finally:
        averager.shutdown()


def test_heads_stopped_together_wait_for_the_heads_still_on_their_way():
    # h0 reaches the cross stage at once, h1 and h2 four periods later. Before, h0 gave up after three
    # ("this peer is leaving and no group formed") and its cohort's contribution was lost; in the
    # 16-peer churn runs the time limit's stop cost 4-14 peer-rounds so.
    assert LATE > LEAVING_GRACE_FACTOR * TIMEOUTS.matchmaking + 2.0
    heads = {"h0": (50, 3, 0.0), "h1": (51, 5, LATE), "h2": (52, 4, LATE)}
    args = {
        name: dict(rank=rank, seed=seed, samples=n, late=late, run_id="leaving-together")
        for rank, (name, (seed, n, late)) in enumerate(heads.items())
    }
    results = peers._run("leaving-together", args, _leaving_head, timeout=300)
    assert all(r["committed"] for r in results.values()), [
        (r["reason"], r["seconds"]) for r in results.values()
    ]
    assert len({r["digest"] for r in results.values()}) == 1
    want = [
        sum(peers._grads(seed)[i] * n for seed, n, _ in heads.values()) / 12 for i in range(len(peers.SHAPES))
    ]
    for got, expected in zip(results["h0"]["tensors"], want):
        torch.testing.assert_close(torch.from_numpy(got), expected, rtol=1e-5, atol=1e-6)
