"""Robust averaging through the real hierarchy: one peer of a cohort sends a poisoned gradient (x1000,
sign-flipped or NaN) and the others still commit, bit-identical, close to the honest mean, naming it
an outlier in their commit reports; a plain-mean swarm leaves only a NaN out, and names it too."""

from __future__ import annotations

import math
import time
from dataclasses import replace

import pytest
import torch

from hivemind_adapter.allreduce import VerifiedAverager
from hivemind_adapter.dht import peer_id, read_entries, speaker, store
from hivemind_adapter.group_keys import DeclarationSigner
from peer.averaging.factory import build_averager
from peer.averaging.stage import AveragingTimeouts
from peer.guard.peer_guard import BAR_SECONDS, FIRST_OWN_PART_BAR_SECONDS
from protocol.identity import Identity
from robust_aggregation.centered_clip import RobustConfig
from tests.adversaries.dishonest_peer import lying_averager, take_any_reply
from tests.peer.swarm_harness import run_peers, start_bootstrap_dht

pytestmark = pytest.mark.swarm

SHAPE = (1024, 1024)  # 4 MiB: hivemind splits it over every member (a small vector goes to one reducer)
PEERS = 4
SAMPLES = 32
FAST = AveragingTimeouts(matchmaking=2.0, request=1.0, next_chunk=5.0, allreduce=60.0, step=60.0, commit=30.0)


def _gradient(seed: int) -> torch.Tensor:
    """An honest peer's mean gradient: a shared signal plus its own batch noise."""
    signal = torch.randn(SHAPE, generator=torch.Generator().manual_seed(0))
    return signal + 0.3 * torch.randn(SHAPE, generator=torch.Generator().manual_seed(100 + seed))


def _poison(mean: torch.Tensor, attack: str) -> torch.Tensor:
    if attack == "x1000":
        return mean * 1000
    if attack == "sign":
        return -mean * 10
    if attack == "nan":
        return torch.full_like(mean, math.nan)
    return mean


def _join_roster(dht, run_id: str, peers: int = PEERS) -> list[str]:
    """Announce this peer in the run's roster and wait (bounded) until every peer is in it."""
    store(dht, f"{run_id}_roster", True, 300.0, subkey=peer_id(dht))
    deadline = time.monotonic() + 60
    while len(roster := sorted(read_entries(dht, f"{run_id}_roster"))) < peers:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    return roster


def _peer(dht, *, seed, attack, run_id, robust):
    if attack:
        take_any_reply()
    averager = build_averager(
        dht, run_id, "host-a", [torch.zeros(SHAPE)], timeouts=FAST, robust=RobustConfig() if robust else None
    )
    try:
        roster = _join_roster(dht, run_id)
        numerator = [_poison(_gradient(seed), attack) * SAMPLES]
        res = averager.average(0, numerator, SAMPLES, cohort_size=PEERS, num_cohorts=1, expected_peers=roster)
        return dict(
            me=peer_id(dht),
            committed=res.committed,
            reason=res.reason,
            digest=res.digest,
            tensor=None if res.tensors is None else res.tensors[0].numpy(),
            outliers=res.outliers,
        )
    finally:
        averager.shutdown()


def _swarm(peer, args: dict[str, dict]) -> dict:
    """``peer(dht, **args[name])`` in a process of its own per name, on one bootstrap DHT."""
    boot, maddrs = start_bootstrap_dht()
    try:
        return run_peers(peer, maddrs, args)
    finally:
        boot.shutdown()


def _run(run_id: str, attack: str, robust: bool) -> dict:
    return _swarm(
        _peer,
        {
            f"p{i}": dict(seed=i, attack=attack if i == 3 else "", run_id=run_id, robust=robust)
            for i in range(PEERS)
        },
    )


@pytest.mark.parametrize("attack", ["x1000", "sign", "nan"])
def test_one_poisoned_member_is_named_and_the_others_commit_the_honest_mean(attack):
    results = _run(f"robust-{attack}", attack, robust=True)
    honest = [results[f"p{i}"] for i in range(3)]
    attacker = results["p3"]["me"]
    assert all(r["committed"] for r in honest), [r["reason"] for r in honest]
    assert len({r["digest"] for r in honest}) == 1, "every honest peer holds bit-identical tensors"
    want = sum(_gradient(i) for i in range(3)) / 3
    got = torch.from_numpy(honest[0]["tensor"])
    spread = float(torch.linalg.vector_norm(_gradient(0) - want))
    assert float(torch.linalg.vector_norm(got - want)) < 0.1 * spread
    # each honest member reduced a part of the attacker's vector, and says whom it dropped
    assert all(r["outliers"] == [attacker] for r in honest), [r["outliers"] for r in honest]


def test_without_robust_averaging_a_nan_is_left_out_named_and_never_applied():
    """Plain reducers leave a part holding NaN out of their mean (hivemind_adapter.finite_reduce):
    the round commits the honest mean on every peer, the NaN sender's included."""
    results = _run("plain-nan", "nan", robust=False)
    assert all(r["committed"] for r in results.values()), [r["reason"] for r in results.values()]
    assert len({r["digest"] for r in results.values()}) == 1
    want = sum(_gradient(i) for i in range(3)) / 3
    got = torch.from_numpy(results["p0"]["tensor"])
    assert bool(torch.isfinite(got).all())
    assert torch.allclose(got, want, atol=1e-5)
    # plain parts are large (4 MiB): whoever reduced the gradient's one part names the sender, and
    # no one else is named (the sender's own software names it too, should it reduce that part)
    named = [r["outliers"] for r in results.values()]
    assert all(n in ([], [results["p3"]["me"]]) for n in named) and any(named), named


def _noisy_gradient(seed: int, attempt: int) -> torch.Tensor:
    """An honest peer's mean gradient when batch noise is as large as the signal: a flipped one then
    lies within the honest spread, where no distance test can tell it."""
    signal = torch.randn(SHAPE, generator=torch.Generator().manual_seed(attempt))
    return signal + torch.randn(SHAPE, generator=torch.Generator().manual_seed(1000 * attempt + seed + 1))


def _flipping_peer(dht, *, seed, flip, run_id, attempts):
    if flip:
        take_any_reply()
    averager = build_averager(
        dht, run_id, "host-a", [torch.zeros(SHAPE)], timeouts=FAST, robust=RobustConfig()
    )
    try:
        roster = _join_roster(dht, run_id)
        rounds = []
        for attempt in range(attempts):
            gradient = _noisy_gradient(seed, attempt)
            numerator = [(-gradient if flip else gradient) * SAMPLES]
            res = averager.average(
                attempt, numerator, SAMPLES, cohort_size=PEERS, num_cohorts=1, expected_peers=roster
            )
            rounds.append(
                dict(
                    committed=res.committed,
                    reason=res.reason,
                    outliers=res.outliers,
                    tensor=None if res.tensors is None else res.tensors[0].numpy(),
                )
            )
        return dict(me=peer_id(dht), rounds=rounds)
    finally:
        averager.shutdown()


def test_a_sign_flip_inside_the_honest_spread_is_named_by_its_direction_and_then_left_out():
    attempts = 5
    args = {f"p{i}": dict(seed=i, flip=i == 3, run_id="robust-flip", attempts=attempts) for i in range(PEERS)}
    results = _swarm(_flipping_peer, args)
    honest, attacker = [results[f"p{i}"] for i in range(3)], results["p3"]["me"]
    for attempt in range(attempts):
        assert all(r["rounds"][attempt]["committed"] for r in honest), [
            r["rounds"][attempt]["reason"] for r in honest
        ]
    # no distance test sees it: the first attempt averages it in (clipped), and names nobody
    assert all(r["rounds"][0]["outliers"] == [] for r in honest)
    # each honest reducer notes one cosine per attempt (over its whole share): after 4 attempts, 4
    assert all(r["rounds"][3]["outliers"] == [] for r in honest), [r["rounds"][3]["outliers"] for r in honest]
    assert all(r["rounds"][-1]["outliers"] == [attacker] for r in honest), [
        r["rounds"][-1]["outliers"] for r in honest
    ]
    last = attempts - 1
    want = sum(_noisy_gradient(i, last) for i in range(3)) / 3
    got = torch.from_numpy(honest[0]["rounds"][last]["tensor"])
    assert torch.allclose(got, want, atol=1e-5), "once named, the flip takes no part in the average"
    first = torch.from_numpy(honest[0]["rounds"][0]["tensor"])
    assert float(
        torch.linalg.vector_norm(first - sum(_noisy_gradient(i, 0) for i in range(3)) / 3)
    ) > 0.1 * float(torch.linalg.vector_norm(want)), "before it was named, the flip did move the average"


def _peer_beside_a_liar(dht, *, seed, liar, run_id, lie="negated"):
    """Two attempts of one cohort with signed matchmaking and a roster of keys; ``liar``'s reducer
    lies as ``lie`` says (:func:`~tests.adversaries.dishonest_peer.lying_runner`): by default it
    returns the negated centre of every part it reduces. A peer whose attempt failed settles it
    before the next, as the round loop does (:func:`peer.round.run_round`)."""
    identity = Identity.generate()
    mean = sum(_gradient(i) for i in range(PEERS)) / PEERS  # every peer's honest gradient, the liar's too
    averager = build_averager(
        dht, run_id, "host-a", [torch.zeros(SHAPE)], robust=RobustConfig(),
        # the liar gives up first; the honest survivors' regroup gathers to their step bound
        timeouts=replace(FAST, step=15.0, allreduce=10.0) if liar else replace(FAST, step=30.0),
        averager_type=lying_averager(lie) if liar else VerifiedAverager,
        declarations=DeclarationSigner(run_id, speaker(dht, identity)),
        admitted=lambda: {p: str(k) for p, k in read_entries(dht, f"{run_id}_keys").items()},
    )  # fmt: skip
    try:
        store(dht, f"{run_id}_keys", identity.public_key_hex, 300.0, subkey=peer_id(dht))
        roster = _join_roster(dht, run_id)
        outcomes = []
        for attempt in range(2):
            numerator = [_gradient(seed) * SAMPLES]
            res = averager.average(
                attempt, numerator, SAMPLES, cohort_size=PEERS, num_cohorts=1, expected_peers=roster,
                cohorts=[roster],
            )  # fmt: skip
            held = res.tensors if res.tensors is not None else res.pending
            off = (
                None
                if held is None
                else float(torch.linalg.vector_norm(held[0] - mean) / torch.linalg.vector_norm(mean))
            )
            outcomes.append(
                dict(committed=res.committed, reason=res.reason, outliers=res.outliers, digest=res.digest,
                     seconds=dict(res.seconds), contributors=[c.peer for c in res.contributors], off=off)
            )  # fmt: skip
            if not res.committed:
                # the others may still wait on this attempt (for the liar's report): without this a
                # peer alone in a split one met them in the next past its gathering, and they split
                averager.settle(attempt, roster)
        return dict(me=peer_id(dht), outcomes=outcomes, barred=averager.barred_for())
    finally:
        averager.shutdown()


# negated is slow (15 s): members refusing that lie's replies is test_robust_reduce's, and naming and
# barring the liar in a swarm is the same as for the noisy lie
@pytest.mark.parametrize("lie", [pytest.param("negated", marks=pytest.mark.slow), "noise"])
def test_a_lying_reducer_is_named_in_the_failed_attempt_and_left_out_of_the_next(lie):
    """A reducer's lie is refused by every honest member (nothing wrong is written) and breaks the
    stage. Each honest member names the liar in its commit report (two such reports and the aggregator
    refuses its receipt) and bars it from its groups for the full term: the next attempt forms
    without it and commits. (The first may commit too, if the stage's retry formed without the liar.)
    The negated centre fails the reply check; the noisy one passes it and is refused for its own
    part's place (point 5 of the proof), which in a cohort stage is the reducer's own work."""
    results = _swarm(
        _peer_beside_a_liar,
        {f"p{i}": dict(seed=i, liar=i == 3, run_id=f"liar-reducer-{lie}", lie=lie) for i in range(PEERS)},
    )
    honest = [results[f"p{i}"] for i in range(3)]
    liar = results["p3"]["me"]
    first = [r["outcomes"][0] for r in honest]
    assert all(liar in o["outliers"] for o in first), first
    second = [r["outcomes"][1] for r in honest]
    assert all(o["committed"] for o in second), second
    assert len({o["digest"] for o in second}) == 1, "the honest peers hold one result"
    assert not results["p3"]["outcomes"][1]["committed"]  # the liar met nobody
    # barred at its refusal in the first attempt: the full term, less the second attempt's seconds
    assert all(r["barred"][liar] > BAR_SECONDS - 120.0 for r in honest), [r["barred"] for r in honest]


def test_a_reducer_that_tells_each_member_its_own_story_is_caught_by_its_signatures_and_left_out():
    """The liar tells the noisy lie (ten times the centre's length) and sends every member a proof of
    its own, true about that member: every honest member's check passes and each holds the lie. Each
    posts the reducer's signed digest of what it was sent; the digests differ, so no honest peer
    commits, and each bars the liar: the next attempt forms without it and commits."""
    results = _swarm(
        _peer_beside_a_liar,
        {f"p{i}": dict(seed=i, liar=i == 3, run_id="equivocator", lie="equivocate") for i in range(PEERS)},
    )
    honest = [results[f"p{i}"] for i in range(3)]
    liar = results["p3"]["me"]
    outcomes = [o for r in honest for o in r["outcomes"]]
    assert not any(o["committed"] and o["off"] > 0.1 for o in outcomes), "an honest peer committed the lie"
    met = [o for o in outcomes if liar in o["contributors"]]
    assert met, "the liar never took part: nothing was shown"
    for o in met:
        assert not o["committed"] and "different signed proofs" in o["reason"], o["reason"]
        assert o["off"] > 1.0, "every proof check passed and the result held the lie"
    second = [r["outcomes"][1] for r in honest]
    assert all(o["committed"] and liar not in o["contributors"] for o in second), second
    assert len({o["digest"] for o in second}) == 1 and second[0]["off"] < 0.1


def _peer_in_a_pair_of_heads(dht, *, seed, cohort, liar, run_id):
    """Cohort ``host-a`` has three honest peers, ``host-b`` one peer (``liar``: its reducer returns
    every centre plus a random direction ten times its length, with its best proof): the cross stage
    is a pair of heads, where no others' spread exists to hold the liar's own part to."""
    averager = build_averager(
        dht, run_id, cohort, [torch.zeros(SHAPE)], timeouts=FAST, robust=RobustConfig(),
        pairs_held_to_cohort_noise=True,
        averager_type=lying_averager("noise") if liar else VerifiedAverager,
    )  # fmt: skip
    try:
        store(dht, f"{run_id}_cohorts", cohort, 300.0, subkey=peer_id(dht))
        roster = _join_roster(dht, run_id)
        # the cohorts as a peer reads them from the roster's announcements
        named = read_entries(dht, f"{run_id}_cohorts")
        cohorts = [[p for p in roster if named.get(p) == c] for c in ("host-a", "host-b")]
        res = averager.average(
            0, [_gradient(seed) * SAMPLES], SAMPLES, cohort_size=1 if liar else 3, num_cohorts=2,
            cohort_rank=1 if liar else 0, expected_peers=roster, cohorts=cohorts,
        )  # fmt: skip
        return dict(me=peer_id(dht), committed=res.committed, reason=res.reason, digest=res.digest,
                    tensor=None if res.tensors is None else res.tensors[0].numpy(), outliers=res.outliers,
                    contributors=[c.peer for c in res.contributors], barred=averager.barred_for())  # fmt: skip
    finally:
        averager.shutdown()


def test_a_head_that_lies_in_a_pair_of_heads_is_held_to_the_noise_its_partners_cohort_measured():
    """Two cohorts meet as a pair of heads. The honest head measured its cohort's sampling noise along
    the vector in its cohort stage and holds the liar's proof to it: it refuses the noisy parts, names
    the liar, and its cohort commits the mean of its own three members, bit-identical."""
    args = {
        f"p{i}": dict(seed=i, cohort="host-b" if i == 3 else "host-a", liar=i == 3, run_id="pair-of-heads")
        for i in range(PEERS)
    }
    results = _swarm(_peer_in_a_pair_of_heads, args)
    honest = [results[f"p{i}"] for i in range(3)]
    liar = results["p3"]["me"]
    assert all(r["committed"] for r in honest), [r["reason"] for r in honest]
    assert len({r["digest"] for r in honest}) == 1
    assert all(liar not in r["contributors"] for r in honest)
    want = sum(_gradient(i) for i in range(3)) / 3
    torch.testing.assert_close(torch.from_numpy(honest[0]["tensor"]), want, rtol=1e-5, atol=1e-6)
    assert any(liar in r["outliers"] for r in honest), [r["outliers"] for r in honest]  # the honest head
    assert not results["p3"]["committed"]
    # Refused for its own part's place in a cross stage, where an honest head carrying its cohort's
    # bent result looks the same: barred briefly (longer if refused again), not for the full term.
    # Only the head met it; its cohort mates bar nobody.
    barring = [r["barred"] for r in honest if r["barred"]]
    assert len(barring) == 1 and set(barring[0]) == {liar}, [r["barred"] for r in honest]
    assert 0 < barring[0][liar] <= FIRST_OWN_PART_BAR_SECONDS, barring


def _peer_in_a_group_of_three(dht, *, seed, liar, run_id, layout):
    """One peer of three, meeting in one all-reduce: the cohort stage of one cohort of three
    (``layout`` "cohort") or the cross stage of three cohorts of one ("cross"). ``liar``'s reducer
    tells the noisy lie and hides it behind the member whose results it holds back."""
    averager = build_averager(
        dht, run_id, "host-a" if layout == "cohort" else f"host-{seed}", [torch.zeros(SHAPE)], timeouts=FAST,
        robust=RobustConfig(), averager_type=lying_averager("hide") if liar else VerifiedAverager,
    )  # fmt: skip
    try:
        roster = _join_roster(dht, run_id, peers=3)
        # the cohorts as a peer reads them from the roster: one of three, or three of one
        cohorts = [roster] if layout == "cohort" else [(p,) for p in roster]
        res = averager.average(
            0, [_gradient(seed) * SAMPLES], SAMPLES, cohort_size=3 if layout == "cohort" else 1,
            num_cohorts=len(cohorts), cohort_rank=0 if layout == "cohort" else roster.index(peer_id(dht)),
            expected_peers=roster, cohorts=cohorts,
        )  # fmt: skip
        return dict(
            me=peer_id(dht), committed=res.committed, reason=res.reason, checked=res.checked,
            outliers=res.outliers, seconds=res.seconds[layout],
            deadline=averager.deadlines.deadline(layout).seconds,
        )  # fmt: skip
    finally:
        averager.shutdown()


@pytest.mark.parametrize("layout", ["cohort", "cross"])
def test_a_lie_hidden_behind_a_held_back_member_of_three_goes_no_further(layout):
    """The red team's hiding-reducer in an all-reduce of three: the one member it answers has no
    second honest part to hold the result to, and its proof check passes the lie
    (tests/hivemind_adapter/test_reducer_proof.py). Its report and the liar's made a quorum of the
    three: the lie committed. Now that member goes on only once both partners confirm the result it
    received. The held-back member refuses its own misstated entry (and names the liar), so it never
    confirms that result: neither honest peer commits anything, and the one that held the lie says
    why, as soon as the held-back member's marker names the liar."""
    args = {
        f"p{i}": dict(seed=i, liar=i == 2, run_id=f"hidden-in-three-{layout}", layout=layout)
        for i in range(3)
    }
    results = _swarm(_peer_in_a_group_of_three, args)
    honest, liar = [results["p0"], results["p1"]], results["p2"]["me"]
    assert not any(r["committed"] for r in honest), [r["reason"] for r in honest]
    answered = [r for r in honest if "group of three not confirmed" in r["reason"]]
    assert len(answered) == 1, [r["reason"] for r in honest]
    (held_back,) = [r for r in honest if r is not answered[0]]
    # its marker said whom it refused as soon as its all-reduce broke (before it looked for a group again)
    assert f"{held_back['me'][-8:]} refused the averages of {liar[-8:]}" in answered[0]["reason"]
    assert liar in held_back["outliers"], "the held-back member refused the liar's misstated entry"
    # and it stopped looking for a group again once both partners had reported the attempt: before,
    # it looked with nobody left to meet until too little of its stage's deadline was left for a step
    gives_up = held_back["deadline"] - FAST.matchmaking - 0.5
    assert held_back["seconds"] < gives_up, (held_back["seconds"], held_back["deadline"])
    assert len(answered[0]["checked"]) == 1, "it posted its check of that one all-reduce"
