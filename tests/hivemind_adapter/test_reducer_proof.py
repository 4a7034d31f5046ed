"""A reducer's proof of each part's robust centre: what honest reducers' proofs look like to every
member, what a lying reducer can and cannot make pass, and real averagers refusing a noisy reducer."""

from __future__ import annotations

import functools
import math

import pytest
import torch

from hivemind_adapter.allreduce import PartialAllReduceError, VerifiedAverager
from hivemind_adapter.findings import NoiseSlot
from hivemind_adapter.known_groups import known_group_id
from hivemind_adapter.wire_codecs import codec_for, rounding_bound, roundtrip
from robust_aggregation.centered_clip import RobustConfig, capped_weights, centered_clip
from robust_aggregation.reducer_proof import (
    OWN_PART_FACTOR,
    RESULT_FACTOR,
    NoiseMap,
    PartProof,
    check_proof,
    every_members_doubt,
    make_proof,
    noise_level,
    own_part_ratio,
    pack_proofs,
    pair_ratio,
    result_ratio,
    sketch,
    sketch_seed,
    unpack_proofs,
)
from tests.adversaries.dishonest_peer import (
    NOISE_TIMES,
    absent_member_proof,
    covering_proof,
    lying_averager,
    starved_member,
)
from tests.hivemind_adapter.averager_group import ALLREDUCE_TIMEOUT, ARRIVAL_TIMEOUT, step_known_group

CONFIG = RobustConfig()
CAP = functools.partial(capped_weights, max_weight_ratio=CONFIG.max_weight_ratio)


def _means(samples: list[int], size: int = 20_000, seed: int = 0) -> list[torch.Tensor]:
    """Per-sample mean gradients: a shared signal plus noise that shrinks with the samples behind it."""
    g = torch.Generator().manual_seed(seed)
    signal = 0.3 * torch.randn(size, generator=g)
    return [signal + torch.randn(size, generator=g) / math.sqrt(n) for n in samples]


def _proof_of(parts, weights, result, clip, context=b"test"):
    seed = sketch_seed(context, 0, result)
    proof = make_proof(dict(enumerate(parts)), dict(enumerate(weights)), len(parts), result, clip.radius,
                       clip.capped, clip.in_centre, seed)  # fmt: skip
    return proof, seed


def _doubts(proof, parts, weights, reducer, result, seed, rounding=None) -> list[str | None]:
    """What every member other than ``reducer`` says of ``proof``."""
    return every_members_doubt(proof, parts, weights, reducer, result, seed, CAP, rounding=rounding)


def _noisy(result: torch.Tensor, times: float, seed: int = 1) -> torch.Tensor:
    direction = torch.randn(result.shape, generator=torch.Generator().manual_seed(seed))
    return result + direction * (
        times * torch.linalg.vector_norm(result) / torch.linalg.vector_norm(direction)
    )


GROUPS = {
    "three equal": [64, 64, 64],
    "three unequal": [16, 64, 128],
    "six": [64] * 6,
    "four mixed": [8, 32, 64, 256],
}


@pytest.mark.parametrize("group", GROUPS)
def test_every_member_accepts_an_honest_reducers_proof(group):
    samples = GROUPS[group]
    parts, weights = _means(samples), [float(n) for n in samples]
    clip = centered_clip(parts, weights, CONFIG)
    proof, seed = _proof_of(parts, weights, clip.value, clip)
    for reducer in range(len(parts)):
        assert _doubts(proof, parts, weights, reducer, clip.value, seed) == [None] * (len(parts) - 1)
        assert own_part_ratio(proof, reducer) < OWN_PART_FACTOR / 2


def test_an_honest_proof_passes_with_a_poisoned_sender_a_nan_sender_and_a_zero_weight_follower():
    parts = _means([64] * 4, seed=3)
    parts += [parts[0] * 1000, torch.full_like(parts[0], math.nan), torch.zeros_like(parts[0])]
    weights = [64.0] * 6 + [0.0]
    clip = centered_clip(parts, weights, CONFIG)
    assert 4 in clip.outliers and 5 in clip.outliers  # named far, and refused
    proof, seed = _proof_of(parts, weights, clip.value, clip)
    for reducer in range(4):
        assert _doubts(proof, parts, weights, reducer, clip.value, seed) == [None] * 6
    # the poisoner reducing: its own part is far, but not in the centre, so it moves nothing
    assert own_part_ratio(proof, 4) is None
    assert _doubts(proof, parts, weights, 4, clip.value, seed) == [None] * 6


def test_a_clipped_centre_still_balances_its_projected_forces():
    """A sender inside the outlier bound but beyond the radius is clipped, not dropped: the proof's
    radius and distances let every member recompute each part's clipped force."""
    parts = _means([64] * 5, seed=4)
    spread = float(torch.linalg.vector_norm(parts[0] - parts[1]))
    direction = torch.randn(parts[0].shape, generator=torch.Generator().manual_seed(9))
    parts.append(parts[0] + direction / torch.linalg.vector_norm(direction) * 2.5 * spread)
    weights = [64.0] * 6
    clip = centered_clip(parts, weights, CONFIG)
    assert not clip.outliers
    proof, seed = _proof_of(parts, weights, clip.value, clip)
    assert any(d > proof.radius for d in proof.distances), "the test wants a clipped part"
    assert _doubts(proof, parts, weights, 0, clip.value, seed) == [None] * 5


def test_a_noisy_result_with_its_honest_proof_fails_the_projected_fixed_point():
    parts, weights = _means([64, 64, 64]), [64.0] * 3
    clip = centered_clip(parts, weights, CONFIG)
    told = _noisy(clip.value, 0.25)  # a quarter of the centre's length
    proof, seed = _proof_of(parts, weights, told, clip)
    for doubt in _doubts(proof, parts, weights, 2, told, seed):
        assert doubt is not None and "not the centre its proof lists" in doubt


@pytest.mark.parametrize("group", GROUPS)
def test_a_noisy_reducer_that_moves_its_own_part_to_cover_the_noise_is_caught_by_where_that_part_lies(group):
    """The red team's noisy reducer (ten times the centre's length) with its best proof: the others'
    entries true (their owners check them), its own part placed to balance the fixed point, which
    puts it far from every other part."""
    samples = GROUPS[group]
    parts, weights = _means(samples, seed=5), [float(n) for n in samples]
    clip = centered_clip(parts, weights, CONFIG)
    told = _noisy(clip.value, NOISE_TIMES)
    honest, seed = _proof_of(parts, weights, told, clip)
    for reducer in range(len(parts)):
        covered = covering_proof(honest, reducer, told, seed)
        assert own_part_ratio(covered, reducer) > OWN_PART_FACTOR
        for doubt in _doubts(covered, parts, weights, reducer, told, seed):
            assert doubt is not None and "its own part lies" in doubt


@pytest.mark.parametrize("group", ["six", "four mixed"])
def test_a_lie_hidden_behind_a_member_that_never_checks_is_refused_by_every_member_left(group):
    """The noisy lie with the entry of a member that never sees the proof (its results held back until
    the others committed, or it left) placed to balance the fixed point: the liar's own part stays
    true, so point 5 passes, and every checking member's entry is true. Only where the result lies
    relative to the members' own parts (point 6) shows it."""
    samples = GROUPS[group]
    parts, weights = _means(samples, seed=6), [float(n) for n in samples]
    clip = centered_clip(parts, weights, CONFIG)
    told = _noisy(clip.value, NOISE_TIMES)
    honest, seed = _proof_of(parts, weights, told, clip)
    for reducer in range(len(parts)):
        absent = (reducer + 1) % len(parts)
        hidden = absent_member_proof(honest, absent, told, seed)
        doubts = _doubts(hidden, parts, weights, reducer, told, seed)
        checking = [d for m, d in zip((m for m in range(len(parts)) if m != reducer), doubts) if m != absent]
        assert checking and all(d is not None and "farther from this member's part" in d for d in checking)
        # the absent member would have refused it (its own entry is not its part), had it checked
        said = dict(zip((m for m in range(len(parts)) if m != reducer), doubts))[absent]
        assert said is not None and "misstates this member's part" in said


def test_a_members_near_twin_does_not_make_it_refuse_an_honest_result():
    # One other part next to a member's own (a copier's, or a peer on the same samples) brings the
    # nearest part to it, never the one point 6 measures against (the second-nearest or farther).
    parts = _means([64] * 5, seed=7)
    parts.append(parts[0] + 1e-4 * torch.randn(parts[0].shape, generator=torch.Generator().manual_seed(3)))
    weights = [64.0] * 6
    clip = centered_clip(parts, weights, CONFIG)
    proof, seed = _proof_of(parts, weights, clip.value, clip)
    distance = float(torch.linalg.vector_norm(parts[0] - clip.value))
    assert result_ratio(proof, 0, distance) < RESULT_FACTOR / 2
    for reducer in range(6):
        assert _doubts(proof, parts, weights, reducer, clip.value, seed) == [None] * 5


def test_members_of_a_tight_cluster_accept_a_centre_that_lies_among_all_the_parts():
    # Late in training most members' samples are all learned and their means cluster near zero,
    # while a few hold a hard example. Three of six in the cluster are each other's nearest parts;
    # the honest centre lies between the clusters, farther from them than their second-nearest
    # (measured: 3.96 against the limit of 4 in a 120-round run). Point 6 measures by the median.
    g = torch.Generator().manual_seed(11)
    hard = torch.randn(20_000, generator=g)
    parts = [0.02 * torch.randn(20_000, generator=g) for _ in range(3)]
    parts += [hard + 0.3 * torch.randn(20_000, generator=g) for _ in range(3)]
    weights = [64.0] * 6
    clip = centered_clip(parts, weights, CONFIG)
    assert clip.outliers == ()
    proof, seed = _proof_of(parts, weights, clip.value, clip)
    for member in range(3):
        distance = float(torch.linalg.vector_norm(parts[member] - clip.value))
        gaps = sorted(
            float(torch.linalg.vector_norm(parts[member] - p)) for i, p in enumerate(parts) if i != member
        )
        assert (distance / gaps[1]) ** 2 > 10 * RESULT_FACTOR  # the second-nearest would refuse it
        assert result_ratio(proof, member, distance) < RESULT_FACTOR / 2
    for reducer in range(6):
        assert _doubts(proof, parts, weights, reducer, clip.value, seed) == [None] * 5


def test_a_proof_that_misstates_a_members_entry_or_the_cap_is_refused_by_that_member():
    parts, weights = _means([64, 64, 64, 64]), [64.0] * 4
    clip = centered_clip(parts, weights, CONFIG)
    proof, seed = _proof_of(parts, weights, clip.value, clip)
    points = proof.points.clone()
    points[1] += 1e-3 * torch.linalg.vector_norm(points[1])
    moved = PartProof(proof.radius, proof.weights, proof.capped, proof.in_centre, proof.distances, points)
    doubts = _doubts(moved, parts, weights, 0, clip.value, seed)
    assert doubts[0] == "its proof misstates this member's part"  # member 1, and only member 1, sees it
    weights_told = (64.0, 8.0, 64.0, 64.0)
    lighter = PartProof(
        proof.radius, weights_told, proof.capped, proof.in_centre, proof.distances, proof.points
    )
    assert "weight as 8" in _doubts(lighter, parts, weights, 0, clip.value, seed)[0]
    heavier = PartProof(proof.radius, proof.weights, (64.0, 64.0, 64.0, 500.0), proof.in_centre,
                        proof.distances, proof.points)  # fmt: skip
    assert "cap rule" in _doubts(heavier, parts, weights, 0, clip.value, seed)[0]


def test_a_proof_travels_bit_for_bit_and_malformed_ones_are_refused():
    parts, weights = _means([64, 64, 64], size=2048), [64.0] * 3
    clip = centered_clip(parts, weights, CONFIG)
    proof, _seed = _proof_of(parts, weights, clip.value, clip)
    again = PartProof.from_bytes(proof.to_bytes(), 3)
    assert again.to_bytes() == proof.to_bytes() and torch.equal(again.points, proof.points)
    assert unpack_proofs(pack_proofs([proof.to_bytes(), b"", b"x"])) == [proof.to_bytes(), b"", b"x"]
    for bad in (b"", proof.to_bytes()[:-8], b"XXXX" + proof.to_bytes()[4:]):
        with pytest.raises(ValueError):
            PartProof.from_bytes(bad, 3)
    with pytest.raises(ValueError):
        PartProof.from_bytes(proof.to_bytes(), 4)  # another group's size
    with pytest.raises(ValueError):
        unpack_proofs(torch.tensor([9, 0, 0, 0], dtype=torch.uint8))


@pytest.mark.parametrize("codec", ["int8", "int4", "fp16"])
def test_a_lossy_wire_moves_the_result_within_what_its_codec_may_round(codec):
    """Over a lossy codec members receive the centre rounded onto the codec's grid: the fixed point
    is off by that rounding, which the codec bounds; a shifted result is still caught."""
    wire = codec_for(codec)
    parts, weights = [roundtrip(wire, p) for p in _means([64, 64, 64], size=16384)], [64.0] * 3
    clip = centered_clip(parts, weights, CONFIG)
    received = roundtrip(wire, clip.value)
    proof, seed = _proof_of(parts, weights, received, clip)
    rounding = rounding_bound(wire, received)
    assert _doubts(proof, parts, weights, 0, received, seed, rounding) == [None, None]
    told = roundtrip(wire, _noisy(clip.value, NOISE_TIMES))
    lie, seed = _proof_of(parts, weights, told, clip)
    covered = covering_proof(lie, 0, told, seed)
    assert all(
        d is not None for d in _doubts(covered, parts, weights, 0, told, seed, rounding_bound(wire, told))
    )


def test_the_sketch_is_linear_and_keeps_lengths():
    g = torch.Generator().manual_seed(2)
    a, b = torch.randn(50_000, generator=g).double(), torch.randn(50_000, generator=g).double()
    assert torch.allclose(sketch(a - 2 * b, 7), sketch(a, 7) - 2 * sketch(b, 7))
    ratio = float(torch.linalg.vector_norm(sketch(a, 7)) / torch.linalg.vector_norm(a))
    assert 0.6 < ratio < 1.4
    assert not torch.equal(sketch(a, 7), sketch(a, 8))


# ------------------------------------------------------------------ real averagers


@pytest.mark.parametrize("size", [3, 4])
def test_every_honest_member_refuses_a_noisy_reducer_and_writes_nothing(size):
    """The red team's noisy-reducer passed every reply check (its results ~6x a member's part and
    nearly orthogonal to it). With proofs, every honest member refuses its parts, writes nothing and
    names it, in a cohort of three as in a group of four."""
    parts = _means([64] * size, size=4 * 65536, seed=8)

    results, outcomes, named, peer_ids = step_known_group(
        size,
        lambda i: [parts[i]],
        lambda i: dict(robust=CONFIG),
        lambda i: lying_averager("noise") if i == size - 1 else VerifiedAverager,
        prefix=f"noisy-reducer-{size}",
        part_size_bytes=256 * 1024,
    )
    liar = peer_ids[-1]
    for i in range(size - 1):
        assert isinstance(outcomes[i], PartialAllReduceError), outcomes
        assert f"{liar[-8:]}: AllreduceException: refused its parts" in str(outcomes[i]), outcomes[i]
        assert "its own part lies" in str(outcomes[i]), outcomes[i]
        assert torch.equal(results[i][0], parts[i]), "a refused step writes nothing"
        assert liar in named[i], named


@pytest.mark.parametrize("size", [3, 4])
def test_a_reducer_that_starves_one_member_and_hides_its_lie_behind_it(size):
    """The red team's hiding-reducer: it holds one member's results back until the others are done
    (that member then refuses its own misstated entry, too late to matter in a swarm) and tells every
    member one story, its own part true and the held-back member's entry placed to balance the noise
    lie. In a group of four, every member left refuses it (point 6) and writes nothing. In a group
    of three, the one member left has no second honest part to measure by: the lie passes the
    proof check. (In a round it then goes no further: that member waits for both partners to
    confirm the result, which the held-back one never does; tests/peer/averaging/test_robust_averaging.py.)"""
    parts = _means([64] * size, size=4 * 65536, seed=9)
    results, outcomes, named, peer_ids = step_known_group(
        size,
        lambda i: [parts[i]],
        lambda i: dict(robust=CONFIG),
        lambda i: lying_averager("hide") if i == size - 1 else VerifiedAverager,
        prefix=f"hiding-reducer-{size}",
        part_size_bytes=256 * 1024,
    )
    liar = peer_ids[-1]
    order = sorted(peer_ids)  # the known group's senders, in the order its members agree on
    starved = peer_ids.index(order[starved_member(order.index(liar), size)])
    assert "misstates this member's part" in str(outcomes[starved]), outcomes[starved]
    assert torch.equal(results[starved][0], parts[starved])
    left = [i for i in range(size - 1) if i != starved]
    for i in left:
        if size == 3:
            assert outcomes[i] is None, outcomes[i]  # the lie passed
            assert not torch.equal(results[i][0], parts[i])
            continue
        assert isinstance(outcomes[i], PartialAllReduceError), outcomes
        assert f"{liar[-8:]}: AllreduceException: refused its parts" in str(outcomes[i]), outcomes[i]
        assert "farther from this member's part" in str(outcomes[i]), outcomes[i]
        assert torch.equal(results[i][0], parts[i]), "a refused step writes nothing"
        assert liar in named[i], named


def test_an_honest_robust_group_commits_its_mean_with_proofs_checked():
    parts = _means([64, 32, 128], size=2 * 65536, seed=9)
    results, outcomes, named, _ids = step_known_group(
        3, lambda i: [parts[i]], lambda i: dict(robust=CONFIG), prefix="honest-proofs",
        part_size_bytes=128 * 1024,
    )  # fmt: skip
    assert outcomes == [None] * 3, outcomes
    assert all(torch.equal(r[0], results[0][0]) for r in results)
    assert named == [[]] * 3


def test_model_parallel_parts_that_differ_by_design_are_not_held_to_each_others_spread():
    """In a model-parallel cross stage each cohort's mean is of its own sub-networks: a reducer whose
    cohort trained other weights than two others sends a part farther from theirs than they lie from
    each other, honestly (here: six times their noise, not yet far enough to be named). Its proof
    holds, and only the own-part test would refuse it, which ``like_parts=False`` (RobustConfig, set
    for that stage) leaves out."""
    g = torch.Generator().manual_seed(12)
    size = 20_000
    base = torch.randn(size, generator=g)
    parts = [base + 0.05 * torch.randn(size, generator=g) for _ in range(2)]
    other = torch.randn(size, generator=g)
    parts.append(base + 6 * 0.05 * math.sqrt(size) * other / torch.linalg.vector_norm(other))
    weights = [1.0, 1.0, 1.0]
    clip = centered_clip(parts, weights, RobustConfig(like_parts=False))
    assert clip.in_centre == (0, 1, 2)
    proof, seed = _proof_of(parts, weights, clip.value, clip)
    assert own_part_ratio(proof, 2) > OWN_PART_FACTOR
    assert "its own part lies" in _doubts(proof, parts, weights, 2, clip.value, seed)[0]
    unlike = [
        check_proof(
            proof,
            member=m,
            own_part=parts[m],
            own_weight=1.0,
            reducer=2,
            result=clip.value,
            seed=seed,
            cap_rule=CAP,
            like_parts=False,
        )  # fmt: skip
        for m in (0, 1)
    ]
    assert unlike == [None, None]


# ------------------------------------------------------------------ pairs


def test_a_pairs_reducer_is_held_to_the_sampling_noise_measured_in_another_stage():
    """Two cohorts' heads make a pair: the liar's own part is the only other point, so no spread of
    the others exists to hold it to. A head measured its cohort's spread in the cohort stage
    (noise_level: the same per-sample noise), and the pair's reducer is held to that."""
    peers = _means([64] * 9, seed=14)  # one gradient's estimates, three cohorts of three
    members = peers[:3]  # this head's cohort, weighed by their samples
    cohort = centered_clip(members, [64.0] * 3, CONFIG)
    measured, _seed = _proof_of(members, [64.0] * 3, cohort.value, cohort)
    reference = noise_level(measured)
    assert reference is not None and reference > 0
    heads = [torch.stack(peers[3:6]).mean(0), torch.stack(peers[6:]).mean(0)]  # two cohorts' means
    weights = [192.0, 192.0]
    clip = centered_clip(heads, weights, CONFIG)
    honest, seed = _proof_of(heads, weights, clip.value, clip)
    assert own_part_ratio(honest, 1) is None  # a pair: no others' spread
    assert pair_ratio(honest, 1, reference) < OWN_PART_FACTOR / 2
    assert _doubts(honest, heads, weights, 1, clip.value, seed) == [None]
    told = _noisy(clip.value, NOISE_TIMES)
    lie, seed = _proof_of(heads, weights, told, clip)
    covered = covering_proof(lie, 1, told, seed)
    assert _doubts(covered, heads, weights, 1, told, seed) == [None]  # without a reference it passes
    doubt = check_proof(covered, member=0, own_part=heads[0], own_weight=192.0, reducer=1, result=told, seed=seed,
                        cap_rule=CAP, noise_reference=reference)  # fmt: skip
    assert doubt is not None and "in a pair, its own part lies" in doubt


def test_a_member_with_a_noise_reference_refuses_a_noisy_reducer_of_a_pair():
    """The same through real averagers: the member's reference (what its cohort stage measured,
    set by its owner) travels into the averager's process and its check."""
    parts = _means([64] * 5, size=4 * 65536, seed=17)
    members = [p[:65536] for p in parts[2:]]
    cohort = centered_clip(members, [1.0] * 3, CONFIG)
    measured, _seed = _proof_of(members, [1.0] * 3, cohort.value, cohort)
    per_value = noise_level(measured) / 65536  # as if measured over the whole vector

    def take_step(i, averager, peer_ids):
        averager.set_noise_reference(NoiseMap(((0, 4 * 65536, per_value),)))
        return averager.step_in_known_group(
            known_group_id("robust-test-0", *sorted(peer_ids)), sorted(peer_ids), weight=1.0,
            arrival_timeout=ARRIVAL_TIMEOUT, allreduce_timeout=ALLREDUCE_TIMEOUT,
        )  # fmt: skip

    results, outcomes, named, peer_ids = step_known_group(
        2,
        lambda i: [parts[i]],
        lambda i: dict(robust=CONFIG),
        lambda i: lying_averager("noise") if i == 1 else VerifiedAverager,
        prefix="noisy-pair",
        part_size_bytes=256 * 1024,
        take_step=take_step,
    )
    assert isinstance(outcomes[0], PartialAllReduceError), outcomes
    assert "in a pair, its own part lies" in str(outcomes[0]), outcomes[0]
    assert torch.equal(results[0][0], parts[0]), "a refused step writes nothing"
    assert peer_ids[1] in named[0], named


def test_a_noise_map_gives_a_part_the_noise_of_its_own_values_and_is_taken_once():
    noise = NoiseMap(((0, 100, 1.0), (100, 300, 5.0)))
    assert noise.over(0, 100) == 100.0
    assert noise.over(50, 150) == 50 * 1.0 + 50 * 5.0
    assert noise.over(250, 400) is None  # a third covered: not enough to hold a part to
    shared = NoiseSlot()
    assert shared.read() is None
    shared.write(noise)
    assert shared.read() == noise and shared.take() == noise and shared.take() is None


def _step_keeping_noise(maps: dict):
    """A ``take_step`` for :func:`step_known_group`: member ``i`` averages in the known group with
    weight 64 and its measured noise map goes into ``maps[i]``."""

    def take_step(i, averager, peer_ids):
        outcome = averager.step_in_known_group(
            known_group_id("robust-test-0", *sorted(peer_ids)), sorted(peer_ids), weight=64.0,
            arrival_timeout=ARRIVAL_TIMEOUT, allreduce_timeout=ALLREDUCE_TIMEOUT,
        )  # fmt: skip
        maps[i] = averager.take_measured_noise()
        return outcome

    return take_step


def test_an_honest_all_reduce_measures_the_noise_along_its_whole_vector():
    """What a cohort stage hands its cross stage: every proof a member accepted and its own
    reducer's cover the vector, each part with the noise of its own values."""
    parts = _means([64] * 3, size=3 * 65536, seed=18)
    maps = {}
    take_step = _step_keeping_noise(maps)

    _results, outcomes, _named, _ids = step_known_group(
        3, lambda i: [parts[i]], lambda i: dict(robust=CONFIG), prefix="noise-map",
        part_size_bytes=256 * 1024, take_step=take_step,
    )  # fmt: skip
    assert outcomes == [None] * 3, outcomes
    for noise in maps.values():
        assert noise is not None and noise.over(0, 3 * 65536) is not None
        assert noise == maps[0]  # every member saw the same proofs
    # the noise of one unit of weight: |x_i - x_j|^2 / (1/64 + 1/64), per value, about 1 here
    assert 0.5 < maps[0].over(0, 3 * 65536) / (3 * 65536) < 2.0


def test_a_member_that_reduces_every_part_holds_the_result_and_its_noise_map():
    """A vector of one part (a small model, hivemind's 512 KiB parts) has one reducer: that member
    checks no remote proof, and measured its noise map from its own reducer's parts only after the
    runner had dropped its parts' record (IndexError: it alone broke, the others held the result)."""
    parts = _means([64] * 3, size=4096, seed=19)
    maps = {}
    take_step = _step_keeping_noise(maps)

    results, outcomes, _named, _ids = step_known_group(
        3, lambda i: [parts[i]], lambda i: dict(robust=CONFIG), prefix="one-part", take_step=take_step
    )
    assert outcomes == [None] * 3, outcomes
    assert all(torch.equal(r[0], results[0][0]) for r in results)
    assert all(noise is not None and noise == maps[0] for noise in maps.values()), maps
    assert maps[0].over(0, 4096) is not None
