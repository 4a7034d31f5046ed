"""A cohort leader killed after its cohort's all-reduce: the next member carries the cohort's result
across cohorts in its place (real hivemind processes on 127.0.0.1).

Run p of the churn benchmark: site-2's leader was killed in the cross stage; its member, waiting for
the broadcast, abandoned the round when the leader's announcement expired, the other cohort waited
out its cross-stage deadline (44.7 s) for it, and with 2 of 4 roster peers holding its result nobody
committed: one death cost the whole swarm a 60 s attempt. The member holds the cohort's result too
(an all-reduce leaves it with every member), so it takes the leader's place.
"""

from __future__ import annotations

import os
import signal
import threading

import pytest
import torch

from hivemind_adapter.allreduce import VerifiedAverager
from hivemind_adapter.dht import peer_id, read_entries, store
from peer.averaging.factory import build_averager
from tests.peer.averaging.hierarchy_peers import (
    FAST,
    PEERS,
    SHAPES,
    _grads,
    _outcome,
    _roster,
    _run,
    assert_survivors_hold_the_mean_of_all,
)

pytestmark = pytest.mark.swarm

ALIVE_TTL = 3.0  # a peer's liveness record, refreshed every second: what the roster's announcements do


class _KilledInTheCrossStage(VerifiedAverager):
    """A peer killed (``kill -9`` of its agent) as its cross-cohort all-reduce starts, if it armed
    itself (a file ``armed.<its peer id>``): after its cohort's all-reduce, before its broadcast."""

    armed = ""  # set before the peers are forked

    async def _run_allreduce_inplace_(self, tensors, group_info, group_id=None, **kwargs):
        if self.prefix.endswith("_cross") and os.path.exists(f"{self.armed}.{self.peer_id.to_base58()}"):
            os.kill(os.getpid(), signal.SIGKILL)  # the averager runs in its peer's own process
        return await super()._run_allreduce_inplace_(tensors, group_info, group_id, **kwargs)


# hivemind names a servicer's RPC handlers after its class: the victim must answer as the others do.
_KilledInTheCrossStage.__name__ = VerifiedAverager.__name__


def _stay_alive(dht, run_id: str, done: threading.Event) -> None:
    while not done.is_set():
        store(dht, f"{run_id}_alive", True, ALIVE_TTL, subkey=peer_id(dht))
        done.wait(1.0)


def _headless_cohort_peer(dht, *, name, cohort, rank, seed, samples, run_id):
    """One of two cohorts of two; the leader of rack-b (its smaller peer id) dies in the cross stage."""
    done = threading.Event()
    threading.Thread(target=_stay_alive, args=(dht, run_id, done), daemon=True).start()
    store(dht, f"{run_id}_cohorts", cohort, 300.0, subkey=peer_id(dht))
    roster = _roster(dht, run_id, len(PEERS))
    cohort_of = read_entries(dht, f"{run_id}_cohorts")
    assert len(cohort_of) == len(roster), "every peer posts its cohort before its roster entry"
    if peer_id(dht) == min(p for p, c in cohort_of.items() if c == "rack-b"):
        open(f"{_KilledInTheCrossStage.armed}.{peer_id(dht)}", "w").close()
    averager = build_averager(
        dht, run_id, cohort, [torch.zeros(s) for s in SHAPES], timeouts=FAST,
        averager_type=_KilledInTheCrossStage, online=lambda: list(read_entries(dht, f"{run_id}_alive")),
    )  # fmt: skip
    try:
        numerator = [g * samples for g in _grads(seed)]
        res = averager.average(
            0, numerator, samples, cohort_size=2, num_cohorts=2, cohort_rank=rank, expected_peers=roster,
            cohorts=[[p for p in roster if cohort_of[p] == c] for c in ("rack-a", "rack-b")],
        )  # fmt: skip
        return _outcome(res) | {"me": peer_id(dht)}
    finally:
        done.set()
        averager.shutdown()


def test_a_leader_killed_in_the_cross_stage_is_replaced_by_its_member_and_the_round_commits(
    tmp_path, monkeypatch
):
    args = {
        name: dict(
            name=name, cohort=c, rank=0 if c == "rack-a" else 1, seed=s, samples=n, run_id="hier-takeover"
        )
        for name, (c, s, n, _) in PEERS.items()
    }
    monkeypatch.setattr(_KilledInTheCrossStage, "armed", str(tmp_path / "armed"))
    results = _run("hier-takeover", args, _headless_cohort_peer, timeout=300)
    dead = [n for n, r in results.items() if r is None]
    assert len(dead) == 1 and PEERS[dead[0]][0] == "rack-b", f"rack-b's leader must have died: {dead}"
    # The dead leader's gradient reached its cohort's result before it died: all four contributed,
    # and the result is their exact sample-weighted mean, held by the three that live.
    assert_survivors_hold_the_mean_of_all([results[n] for n in PEERS if n not in dead])
    successor = next(results[n] for n in PEERS if n not in dead and PEERS[n][0] == "rack-b")
    assert successor["leader"] == successor["me"], "rack-b's member carried its cohort's result on"
