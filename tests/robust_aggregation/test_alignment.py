"""Direction evidence against a sender: the cosines centered_clip measures, the record that keeps
them across all-reduces, and a reducer that leaves a suspect out of its centres."""

from __future__ import annotations

import asyncio
import random

import pytest
import torch

from hivemind_adapter.robust_reduce import RobustPartReducer
from robust_aggregation.alignment import WINDOW, AlignmentConfig, AlignmentRecord
from robust_aggregation.centered_clip import RobustConfig, centered_clip

CONFIG = RobustConfig()


def _noisy(count: int, size: int, noise: float, seed: int) -> list[torch.Tensor]:
    """Parts sharing one direction under per-part noise ``noise`` times its scale (batch noise)."""
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(size, generator=g)
    return [base + noise * torch.randn(size, generator=g) for _ in range(count)]


def test_a_flipped_part_inside_the_honest_spread_is_not_named_but_points_against_the_others():
    parts = _noisy(6, 8192, noise=1.5, seed=1)
    parts[5] = -parts[5]
    result = centered_clip(parts, [1.0] * 6, CONFIG)
    assert result.outliers == (), "a flip this noisy is no distance outlier: only its direction shows"
    cosines = [a.cosine for a in result.alignments]
    honest, flipped = cosines[:5], cosines[5]
    assert all(c > 0.2 for c in honest), honest
    assert flipped < -0.2, flipped


def test_a_long_honest_part_that_is_clipped_reads_as_aligned_as_it_is():
    """Late in training most members' gradients are noise around a small signal, and one whose
    samples hold a hard example sends a longer part, off in a direction of its own. It is clipped,
    not named. Its cosine must be the one with the other parts' mean (they are not clipped): taking
    its whole weighted value out of the clipped centre, as the old estimate did (computed here),
    reads it pointing against the others, and honest members were left out round after round."""
    g = torch.Generator().manual_seed(6)
    base = torch.randn(8192, generator=g)
    parts = [0.3 * base + torch.randn(8192, generator=g) for _ in range(5)]
    parts.append(0.3 * base + 3.0 * torch.randn(8192, generator=g))
    result = centered_clip(parts, [1.0] * 6, CONFIG)
    long, centre = parts[5].double(), result.value.double()
    assert result.outliers == () and float(torch.linalg.vector_norm(long - centre)) > result.radius
    others = torch.stack(parts[:5]).double().mean(0)
    truth = float(long @ others / (torch.linalg.vector_norm(long) * torch.linalg.vector_norm(others)))
    assert truth > 0 and result.alignments[5].cosine == pytest.approx(truth, abs=1e-6)
    old = (centre * 6 - long) / 5
    assert float(long @ old / (torch.linalg.vector_norm(long) * torch.linalg.vector_norm(old))) < -0.1


def test_an_excluded_part_is_left_out_of_the_centre_and_still_measured():
    parts = _noisy(5, 4096, noise=0.5, seed=2)
    parts[4] = -parts[4]
    result = centered_clip(parts, [1.0] * 5, CONFIG, excluded=[4])
    want = torch.stack(parts[:4]).double().mean(0).float()
    assert torch.allclose(result.value, want, atol=1e-6)
    assert result.alignments[4].cosine < -0.5
    assert 4 not in result.outliers  # naming a suspect is the record's word, not this part's


def test_a_suspect_is_not_left_out_where_only_two_parts_would_remain():
    """Of three parts, one honest suspect (a record soured while an x1000 sender was still in the
    centre) is kept: left out, the centre was the mean of the other honest part and the x1000 one
    (measured on the emulated internet: an honest reducer's replies came back 507 times too long)."""
    parts = _noisy(3, 4096, noise=0.1, seed=4)
    parts[2] = 1000 * parts[2]
    result = centered_clip(parts, [96.0] * 3, CONFIG, excluded=[0])
    honest = torch.stack(parts[:2]).double().mean(0).float()
    assert float(torch.linalg.vector_norm(result.value - honest)) < 0.5 * float(
        torch.linalg.vector_norm(honest)
    )
    assert 0 not in result.outliers
    # with four parts a suspect is still left out: three remain to outvote one
    four = _noisy(4, 4096, noise=0.5, seed=5)
    four[3] = -four[3]
    left_out = centered_clip(four, [1.0] * 4, CONFIG, excluded=[3])
    assert torch.allclose(left_out.value, torch.stack(four[:3]).double().mean(0).float(), atol=1e-6)


def test_excluding_everyone_leaves_the_centre_to_all_of_them():
    parts = _noisy(3, 2048, noise=0.1, seed=3)
    result = centered_clip(parts, [1.0] * 3, CONFIG, excluded=[0, 1, 2])
    assert torch.allclose(result.value, torch.stack(parts).double().mean(0).float(), atol=1e-6)


def test_a_lone_or_zero_weight_part_has_no_alignment():
    parts = _noisy(3, 2048, noise=0.1, seed=4)
    assert centered_clip(parts[:1], [1.0], CONFIG).alignments == (None,)
    alignments = centered_clip(parts, [1.0, 0.0, 1.0], CONFIG).alignments
    assert alignments[1] is None and alignments[0].cosine > 0.9 and alignments[2].cosine > 0.9


def _stream(record: AlignmentRecord, rng: random.Random, parts: int, mean: float, spread: float, flipped=()):
    """Feed ``parts`` parts of six senders whose cosines scatter around ``mean``; ``flipped`` senders'
    around ``-mean``. Returns the part after which each sender was first named."""
    named_at: dict[str, int] = {}
    for part in range(parts):
        record.note_part(
            {f"s{i}": rng.gauss(-mean if f"s{i}" in flipped else mean, spread) for i in range(6)}
        )
        for name in record.suspects():
            named_at.setdefault(name, part)
    return named_at


@pytest.mark.parametrize("seed", range(5))
def test_honest_senders_whose_cosines_often_dip_below_zero_are_never_named(seed):
    # mean 0.1 and spread 0.15: one honest cosine in four is negative (late training, small batches)
    record = AlignmentRecord()
    assert _stream(record, random.Random(seed), 2000, mean=0.1, spread=0.15) == {}


@pytest.mark.parametrize("seed", range(5))
def test_a_flipped_sender_is_named_within_a_window_and_only_it(seed):
    # the digits supernet's per-part cosines at 64 samples a peer: mean about the spread (measured)
    record = AlignmentRecord()
    named_at = _stream(record, random.Random(seed), 200, mean=0.13, spread=0.13, flipped={"s5"})
    assert set(named_at) == {"s5"}
    assert named_at["s5"] < WINDOW
    assert record.score("s0") > 0 > record.score("s5")


@pytest.mark.parametrize("seed", range(3))
def test_nobody_is_named_while_the_swarm_s_own_alignment_is_not_measurable(seed):
    # late training: honest cosines centred on zero. At 3 standard errors a window of six such
    # senders fell below -3 about once in 700 (it did, 2 honest receipts refused in 13,200)
    record = AlignmentRecord()
    assert _stream(record, random.Random(seed), 2000, mean=0.0, spread=0.1) == {}
    assert record.swarm_score() is not None and abs(record.swarm_score()) < 2
    without = AlignmentRecord(AlignmentConfig(swarm_z=0.0))  # the old rule names some of them
    assert _stream(without, random.Random(seed), 2000, mean=0.0, spread=0.1) != {}


def test_the_swarm_s_alignment_is_that_of_the_senders_seen_lately():
    record, rng = AlignmentRecord(), random.Random(3)
    _stream(record, rng, 40, mean=0.3, spread=0.1)  # s0-s5, well aligned, then they leave
    assert record.swarm_score() > 5
    for _ in range(WINDOW):  # six others whose cosines carry no signal
        record.note_part({f"t{i}": rng.gauss(0.0, 0.1) for i in range(6)})
    assert abs(record.swarm_score()) < 2 and record.suspects() == set()


@pytest.mark.parametrize("seed", range(3))
def test_in_a_group_of_three_a_flipped_sender_is_named_although_it_cancels_the_others_agreement(seed):
    # one flipped of three: each honest sender's "others" are the other honest one and the flip,
    # whose centre carries no signal, so honest cosines sit at zero (the emulated internet's cohorts)
    record, rng = AlignmentRecord(), random.Random(seed)
    named_at = None
    for part in range(40):
        record.note_part({"h1": rng.gauss(0.0, 0.1), "h2": rng.gauss(0.0, 0.1), "f": rng.gauss(-0.2, 0.1)})
        if "f" in record.suspects():
            named_at = part
            break
    assert named_at is not None and named_at < WINDOW
    assert record.swarm_score() is None  # too few senders for their median to stand for the swarm


def test_a_sender_that_stops_flipping_is_no_longer_named_once_its_window_turns():
    record, rng = AlignmentRecord(), random.Random(7)
    _stream(record, rng, 40, mean=0.3, spread=0.1, flipped={"s2"})
    assert record.suspects() == {"s2"}
    _stream(record, rng, WINDOW, mean=0.3, spread=0.1)
    assert record.suspects() == set()


def test_no_one_is_named_without_enough_evidence():
    record = AlignmentRecord(AlignmentConfig(min_cosines=4))
    for _ in range(3):
        record.note_part({"a": 0.5, "b": 0.4, "c": -0.9})
    assert record.score("c") is None and record.suspects() == set()
    record.note_part({"a": 0.5})  # one sender says nothing
    assert record.score("a") is None
    with pytest.raises(ValueError):
        AlignmentConfig(min_cosines=0)
    with pytest.raises(ValueError):
        AlignmentConfig(z_score=float("nan"))
    with pytest.raises(ValueError):
        AlignmentConfig(swarm_z=-1.0)


def test_the_reducer_leaves_excluded_senders_out_and_records_one_cosine_per_sender_over_its_share():
    """Two parts of one all-reduce give one cosine per sender, over both together: a sender's parts
    of one all-reduce come from one batch, so they are one piece of evidence, not two."""
    parts = _noisy(4, 8192, noise=0.5, seed=5)
    parts[3] = -parts[3]
    halves = [(p[:4096], p[4096:]) for p in parts]

    async def run():
        reducer = RobustPartReducer([torch.Size([4096])] * 2, 4, CONFIG, excluded=[3])

        async def send(i):
            return [await reducer.accumulate_part(i, j, halves[i][j], weight=1.0) for j in range(2)]

        return reducer, await asyncio.gather(*(send(i) for i in range(4)))

    reducer, results = asyncio.run(run())
    want = torch.stack(parts[:3]).double().mean(0).float()
    assert all(torch.allclose(torch.cat(r), want, atol=1e-6) for r in results)
    assert len(reducer.alignments) == 1
    cosines = reducer.alignments[0]
    assert cosines[3] < -0.5 < 0.5 < min(cosines[i] for i in range(3))
    # an honest sender's share against the mean of the other two honest ones (the centre's others)
    x, others = parts[0].double(), torch.stack(parts[1:3]).double().mean(0)
    assert cosines[0] == pytest.approx(float(x @ others / (x.norm() * others.norm())), abs=1e-6)
