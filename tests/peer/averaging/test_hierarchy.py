"""Hierarchical averaging over real hivemind processes on 127.0.0.1: the exact sample-weighted mean,
the model-parallel combination, fp16 across cohorts, a peer killed mid-round, and a run of one
cohort whose members come apart."""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch

from hivemind_adapter.dht import peer_id
from peer.averaging.factory import build_averager
from tests.peer.averaging.hierarchy_peers import (
    FAST,
    PEERS,
    SHAPES,
    _args,
    _crafted_masks,
    _grads,
    _outcome,
    _ranks,
    _roster,
    _run,
    assert_no_split_of_two_on_time_and_two_late,
)

pytestmark = pytest.mark.swarm


def test_four_peers_in_two_cohorts_reach_the_exact_sample_weighted_mean():
    results = _run("hier-dp", _args("hier-dp"))
    total = sum(n for _, _, n, _ in PEERS.values())
    expected = [sum(_grads(s)[i] * n for _, s, n, _ in PEERS.values()) / total for i in range(len(SHAPES))]
    rounds = [results[name][0] for name in PEERS]
    # a string, which pytest prints whole (a list's repr it cuts short)
    assert all(r["committed"] for r in rounds), "\n".join(f"{r['reason']} {r['seconds']}" for r in rounds)
    assert len({r["digest"] for r in rounds}) == 1, "every peer must hold bit-identical tensors"
    for r in rounds:
        for got, want in zip(r["tensors"], expected):
            torch.testing.assert_close(torch.from_numpy(got), want, rtol=1e-5, atol=1e-6)
        assert len(r["contributors"]) == 4 and r["contributors"] == rounds[0]["contributors"]
    assert len({r["leader"] for r in rounds}) == 2, "one leader per cohort"


def test_model_parallel_rounds_sum_cohort_means_without_diluting_untouched_weights():
    results = _run("hier-mp", _args("hier-mp", masked=True))
    expected = [torch.zeros(s, dtype=torch.float64) for s in SHAPES]
    for cohort in ("rack-a", "rack-b"):
        members = [(seed, n, key) for c, seed, n, key in PEERS.values() if c == cohort]
        samples = sum(n for _, n, _ in members)
        for seed, n, key in members:
            for i, (g, m) in enumerate(zip(_grads(seed), _crafted_masks(key))):
                expected[i] += (g * m).double() * n / samples
    rounds = [results[name][0] for name in PEERS]
    assert all(r["committed"] for r in rounds), [r["reason"] for r in rounds]
    assert len({r["digest"] for r in rounds}) == 1
    for r in rounds:
        for got, want in zip(r["tensors"], expected):
            torch.testing.assert_close(torch.from_numpy(got), want.float(), rtol=1e-5, atol=1e-6)
    # [1][0] was used only by cohort a (3 + 5 samples): cohort b's 9 samples did not dilute it.
    g0, g1 = _grads(0)[1][0].item(), _grads(1)[1][0].item()
    assert float(rounds[0]["tensors"][1][0]) == pytest.approx((3 * g0 + 5 * g1) / 8, rel=1e-5)
    # [1][8] was used by nobody: exactly zero. Row 2 of tensor 0 by both: the sum of both means.
    assert float(rounds[0]["tensors"][1][8]) == 0.0
    g = {seed: _grads(seed)[0][2, 0].item() for seed in range(4)}
    both = (3 * g[0] + 5 * g[1]) / 8 + (2 * g[2] + 7 * g[3]) / 9
    assert float(rounds[0]["tensors"][0][2, 0]) == pytest.approx(both, rel=1e-5)


# Slow (make test-all): a 64 MB all-reduce killed midway; the default suite loses a member inside a
# group's all-reduce (test_a_group_that_loses_a_member_inside_its_all_reduce_forms_again_without_it).
@pytest.mark.slow
def test_a_peer_killed_mid_round_leaves_the_survivors_identical_and_the_next_round_works():
    import multiprocessing as mp

    shapes = [(4_000, 4_000)]  # 64 MB: the all-reduce lasts over a second on this machine
    # Round 0 gives the peers a history of how long groups take (their deadlines follow it); the
    # victim dies in round 1; round 2 runs without it.
    args = _args("hier-kill", sizes=[(2, 2), (2, 2), (2, 2)], shapes=shapes)
    args["p2"]["sizes"] = [(2, 2), (2, 2), (1, 2)]  # after the death, p2's roster shows it alone in rack-b
    events = {name: (mp.get_context("fork").Event(), mp.get_context("fork").Event()) for name in PEERS}
    for name, pair in events.items():
        args[name]["events"] = pair
    killed_mid_round = []

    def kill_p3_mid_round(procs):
        # Once the victim and its cohort partner are in round 1: a victim done with round 0 before its
        # partner (it may commit on the others' quorum) would otherwise die inside the partner's round
        # 0. Not waiting for the other cohort too: a peer of rack-a that enters round 1 seconds late
        # (a slow commit of round 0 on this 2-core machine) let the victim finish round 1 first.
        for name in ("p3", "p2"):
            assert events[name][0].wait(timeout=120), f"{name} never reached round 1"
        time.sleep(0.5)  # inside the cohort stage's matchmaking or all-reduce of round 1
        killed_mid_round.append(not events["p3"][1].is_set())
        os.kill(procs["p3"].pid, signal.SIGKILL)

    results = _run("hier-kill", args, on_started=kill_p3_mid_round, timeout=400)
    assert killed_mid_round == [True], "the victim finished round 1 before it was killed"
    assert results["p3"] is None, "the victim was killed before it could report"
    survivors = [results[n] for n in ("p0", "p1", "p2")]
    assert all(s[0]["committed"] for s in survivors), [s[0]["reason"] for s in survivors]
    first = [s[1] for s in survivors]
    # Round 1: whoever commits holds one result, named by its contributors; whoever does not keeps its
    # previous values and says why (partial participation: a death costs its own contribution, and
    # at most the round of the peers whose all-reduce it broke).
    committed = [f for f in first if f["committed"]]
    assert len({f["digest"] for f in committed}) <= 1, [f["reason"] for f in first]
    assert all(f["tensors"] is None and f["reason"] for f in first if not f["committed"])
    assert all(f["contributors"] == committed[0]["contributors"] for f in committed)
    # Round 2 without the victim (still in everyone's roster, as until its announcement expires):
    # three of four are a quorum, and the survivors average among themselves, identically.
    second = [s[2] for s in survivors]
    assert all(s["committed"] for s in second), [(s["reason"], s["seconds"]) for s in second]
    assert len({s["digest"] for s in second}) == 1
    total = 3 + 5 + 2
    want = sum(_grads(seed, shapes)[0] * n for seed, n in ((0, 3), (1, 5), (2, 2))) / total
    torch.testing.assert_close(torch.from_numpy(second[0]["tensors"][0]), want, rtol=1e-5, atol=1e-6)


def test_fp16_cross_cohort_stage_keeps_every_peer_bit_identical():
    args = _args("hier-fp16")
    for a in args.values():
        a["fp16"] = True
    results = _run("hier-fp16", args)
    total = sum(n for _, _, n, _ in PEERS.values())
    expected = [sum(_grads(s)[i] * n for _, s, n, _ in PEERS.values()) / total for i in range(len(SHAPES))]
    rounds = [results[name][0] for name in PEERS]
    assert all(r["committed"] for r in rounds), [r["reason"] for r in rounds]
    assert len({r["digest"] for r in rounds}) == 1, "compression must not make peers differ"
    for got, want in zip(rounds[0]["tensors"], expected):
        torch.testing.assert_close(
            torch.from_numpy(got), want, rtol=2e-3, atol=2e-3
        )  # fp16 on the wire: ~3 decimal digits


# ---------------------------------------------------------------- more cohorts than one group holds

# name: (cohort rank, seed, samples); one peer a cohort. 21 samples: the final factor 5/21 is no power of
# two, so a result is not in fp16 by chance.


def _one_cohort_peer(dht, *, seed, samples, late, run_id):
    """One of four peers in a run of one cohort that averages ``late`` s after all four posted their ids."""
    averager = build_averager(dht, run_id, "rack", [torch.zeros(s) for s in SHAPES], timeouts=FAST)
    try:
        roster = _roster(dht, run_id, 4)
        time.sleep(late)
        res = averager.average(
            0, [g * samples for g in _grads(seed)], samples, cohort_size=4, num_cohorts=1,
            expected_peers=roster, cohorts=[roster],
        )  # fmt: skip
        return dict(_outcome(res), me=peer_id(dht))
    finally:
        averager.shutdown()


def test_in_a_run_of_one_cohort_two_members_on_time_wait_for_a_third_rather_than_split_it_in_halves():
    # The cohort stage is the attempt's top group: a result needs 3 of the 4 peers. The two on time
    # gather for 10 s (the top group's wait in a first attempt); the other two come 12 s late. Without
    # a least size of 3, each pair averaged alone and no result could commit (2 of 4 hold each).
    late = {"r0": (60, 3, 0.0), "r1": (61, 5, 0.0), "r2": (62, 4, 12.0), "r3": (63, 6, 12.0)}
    args = {
        name: dict(seed=seed, samples=n, late=delay, run_id="one-cohort-split")
        for name, (seed, n, delay) in late.items()
    }
    results = _run("one-cohort-split", args, _one_cohort_peer, timeout=300)
    assert_no_split_of_two_on_time_and_two_late([results[n] for n in late])


# ---------------------------------------------------------------- cohorts that meet as known groups


def _ranked_peer(dht, *, cohort, rank, seed, samples, client_mode, attempts, run_id):
    """One of four peers in two cohorts of two, for ``attempts`` attempts with the roster's cohorts."""
    averager = build_averager(
        dht, run_id, cohort, [torch.zeros(s) for s in SHAPES], timeouts=FAST, client_mode=client_mode
    )
    try:
        ranks = _ranks(dht, run_id, len(PEERS), rank)
        cohorts = [tuple(sorted(p for p, r in ranks.items() if r == k)) for k in (0, 1)]
        out = []
        for attempt in range(attempts):
            res = averager.average(
                attempt, [g * samples for g in _grads(seed)], samples, cohort_size=2, num_cohorts=2, cohort_rank=rank,
                expected_peers=sorted(ranks), cohorts=cohorts,
            )  # fmt: skip
            if not res.committed:
                averager.settle(attempt, sorted(ranks))
            out.append(dict(_outcome(res), known_group=res.known_group))
        return dict(rounds=out, known_failures=averager._known.failures)
    finally:
        averager.shutdown()


def test_a_cohort_that_met_meets_again_as_a_known_group_but_not_one_with_a_client_mode_member():
    # p1 cannot serve (client mode), so rack-a keeps to matchmaking rather than waiting out a known
    # group p1 never joins; rack-b, which met whole in attempt 0, meets without matchmaking from
    # attempt 1 on. Every attempt is exact.
    args = {
        name: dict(cohort=c, rank=int(c != "rack-a"), seed=s, samples=n, client_mode=name == "p1",
                   attempts=3, run_id="hier-known")
        for name, (c, s, n, _m) in PEERS.items()
    }  # fmt: skip
    results = _run("hier-known", args, _ranked_peer, timeout=300)
    total = sum(n for _, _, n, _ in PEERS.values())
    expected = [sum(_grads(s)[i] * n for _, s, n, _ in PEERS.values()) / total for i in range(len(SHAPES))]
    for attempt in range(3):
        rounds = {name: results[name]["rounds"][attempt] for name in PEERS}
        assert all(r["committed"] for r in rounds.values()), {n: r["reason"] for n, r in rounds.items()}
        assert len({r["digest"] for r in rounds.values()}) == 1
        for got, want in zip(rounds["p0"]["tensors"], expected):
            torch.testing.assert_close(torch.from_numpy(got), want, rtol=1e-5, atol=1e-6)
        known = {name: r["known_group"] for name, r in rounds.items()}
        assert known == {"p0": False, "p1": False, "p2": attempt > 0, "p3": attempt > 0}, (attempt, known)
    assert {name: results[name]["known_failures"] for name in PEERS} == dict.fromkeys(PEERS, 0)
