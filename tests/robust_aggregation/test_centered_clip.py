"""CenteredClip on its own (robust_aggregation.centered_clip) and a member's reply check
(robust_aggregation.reply_check): pure torch, no hivemind."""

from __future__ import annotations

import math

import pytest
import torch

from robust_aggregation.centered_clip import (
    RobustConfig,
    capped_weights,
    centered_clip,
    slotted_centre,
    without_negative_zeros,
)
from robust_aggregation.reply_check import implausible_reply

CONFIG = RobustConfig()


def _honest(count: int, size: int = 4096, seed: int = 0) -> list[torch.Tensor]:
    """Parts that agree on a common direction, each with its own noise (a tenth of its norm)."""
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(size, generator=g)
    return [base + 0.1 * torch.randn(size, generator=g) for _ in range(count)]


def _mean64(parts: list[torch.Tensor], weights: list[float]) -> torch.Tensor:
    """The weighted mean in float64, summed in order, cast back: what an honest group must get."""
    total = torch.zeros_like(parts[0], dtype=torch.float64)
    for part, weight in zip(parts, weights):
        total += weight * part.double()
    return (total / sum(weights)).to(parts[0].dtype)


def _spread(parts: list[torch.Tensor]) -> float:
    """The honest parts' mean distance to their mean."""
    mean = torch.stack(parts).double().mean(0)
    return float(torch.stack([torch.linalg.vector_norm(p.double() - mean) for p in parts]).mean())


def _spread(parts: list[torch.Tensor]) -> float:
    """The honest parts' mean distance to their mean."""
    mean = torch.stack(parts).double().mean(0)
    return float(torch.stack([torch.linalg.vector_norm(p.double() - mean) for p in parts]).mean())


def _attacks(honest: torch.Tensor) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    nan, inf = honest.clone(), honest.clone()
    nan[123], inf[-1] = math.nan, -math.inf
    return {
        "x1000": honest * 1000,
        "sign flipped": -honest,
        "garbage": torch.randn(honest.shape, generator=g)
        * 100
        * float(honest.norm())
        / honest.numel() ** 0.5,
        "nan": nan,
        "inf": inf,
    }


def _honest_mean_and_probe(parts: list[torch.Tensor]):
    honest_mean = torch.stack(parts[:5]).double().mean(0)
    direction = torch.randn(parts[0].shape, generator=torch.Generator().manual_seed(3)).double()
    direction /= torch.linalg.vector_norm(direction)
    probe = centered_clip(parts[:5], [1.0] * 5, CONFIG)  # about the radius the attacked set will have
    return honest_mean, direction, probe.radius


def test_honest_parts_give_exactly_their_weighted_mean():
    parts = _honest(6)
    for weights in ([1.0] * 6, [1.0, 2.0, 1.0, 1.5, 0.5, 1.0]):  # within max_weight_ratio of the median
        result = centered_clip(parts, weights, CONFIG)
        assert torch.equal(result.value, _mean64(parts, weights))
        assert result.outliers == () and result.value.dtype == torch.float32
    identical = [parts[0].clone() for _ in range(4)]  # the radius is 0 up to rounding: still the mean
    assert torch.equal(centered_clip(identical, [1.0] * 4, CONFIG).value, parts[0])


@pytest.mark.parametrize("attack", ["x1000", "sign flipped", "garbage", "nan", "inf"])
def test_one_bad_part_of_six_is_named_and_moves_the_result_by_almost_nothing(attack):
    parts = _honest(6)
    honest = [p for i, p in enumerate(parts) if i != 2]
    parts[2] = _attacks(parts[2])[attack]
    result = centered_clip(parts, [1.0] * 6, CONFIG)
    distance = float(torch.linalg.vector_norm(result.value.double() - torch.stack(honest).double().mean(0)))
    assert distance < 0.1 * _spread(honest), (attack, distance, _spread(honest))
    assert result.outliers == (2,)
    assert torch.isfinite(result.value).all()


def test_a_bad_part_within_the_drop_bound_moves_the_result_by_at_most_its_share_of_the_radius():
    """Not far enough to be dropped: clipped to the radius, it pulls by at most w_bad / w_honest of it."""
    parts = _honest(6)
    honest_mean, direction, radius = _honest_mean_and_probe(parts)
    parts[5] = (honest_mean + 0.8 * CONFIG.drop_factor * radius * direction).float()
    result = centered_clip(parts, [1.0] * 6, CONFIG)
    assert result.outliers == () and result.dropped == ()
    assert result.in_centre == (0, 1, 2, 3, 4, 5)
    shift = float(torch.linalg.vector_norm(result.value.double() - honest_mean))
    assert shift <= 1.01 * result.radius / 5


def test_a_bad_part_between_the_drop_and_outlier_bounds_is_dropped_but_not_named():
    """Beyond drop_factor radii (an honest batch with a hard example can lie there late in training)
    a part has no say in the centre, which is then the others' mean; its sender keeps its credit."""
    parts = _honest(6)
    honest_mean, direction, radius = _honest_mean_and_probe(parts)
    between = (CONFIG.drop_factor + CONFIG.outlier_factor) / 2
    parts[5] = (honest_mean + between * radius * direction).float()
    result = centered_clip(parts, [1.0] * 6, CONFIG)
    assert result.outliers == () and result.dropped == (5,)
    assert result.in_centre == (0, 1, 2, 3, 4)
    assert torch.equal(result.value, _mean64(parts[:5], [1.0] * 5))
    assert result.alignments[5] is not None  # still measured, against the centre it had no say in


def test_the_drop_bound_lies_between_one_and_the_outlier_bound():
    for drop, name in ((0.5, 10.0), (11.0, 10.0), (math.nan, 10.0)):
        with pytest.raises(ValueError, match="drop_factor"):
            RobustConfig(drop_factor=drop, outlier_factor=name)
    assert RobustConfig(drop_factor=4.0, outlier_factor=4.0).drop_factor == 4.0


def test_zero_weight_parts_take_no_part_and_are_never_outliers():
    parts = _honest(4)
    with_followers = parts + [torch.zeros_like(parts[0]), parts[0] * 1e6]
    result = centered_clip(with_followers, [1.0] * 4 + [0.0, 0.0], CONFIG)
    assert torch.equal(result.value, _mean64(parts, [1.0] * 4))
    assert result.outliers == ()


def test_parts_of_a_few_values_are_clipped_but_no_finite_one_is_named():
    g = torch.Generator().manual_seed(5)
    for _ in range(50):
        scalars = [torch.randn(1, generator=g) for _ in range(3)]  # their spread says little
        assert centered_clip(scalars, [1.0] * 3, CONFIG).outliers == ()


def test_two_honest_parts_of_unequal_weight_give_exactly_their_weighted_mean():
    """A pair (two members of a cohort, or two cohorts' heads) weighs its parts by samples, which
    differ most rounds. The weighted median of two is the heavier part, at distance 0 from itself: a
    radius taken from it would be 0, and the centre would be the heavier part alone."""
    two = _honest(2, size=4096, seed=5)
    for weights in ([3.0, 2.0], [2.0, 3.0], [33.0, 32.0], [64.0, 32.0]):
        result = centered_clip(two, weights, CONFIG)
        assert torch.equal(result.value, _mean64(two, weights)), weights
        assert result.outliers == () and result.dropped == ()


def test_no_part_is_named_without_at_least_two_that_agree():
    """Two cohorts' heads meet in a cross-cohort stage, weighted by their samples: the lighter is no
    outlier for being lighter (the weighted median sits on the heavier, at distance 0), nor is either
    of two parts beside one that holds most of the weight. NaN is refused whatever the count."""
    two = _honest(2, size=4096, seed=5)
    assert centered_clip(two, [3.0, 2.0], CONFIG).outliers == ()
    three = _honest(3, size=4096, seed=6)
    assert centered_clip(three, [5.0, 1.0, 1.0], CONFIG).outliers == ()
    poisoned = [two[0], torch.full_like(two[1], math.nan)]
    assert centered_clip(poisoned, [3.0, 2.0], CONFIG).outliers == (1,)


def test_nothing_usable_raises():
    nan = torch.full((8,), math.nan)
    with pytest.raises(ValueError):
        centered_clip([nan, nan.clone()], [1.0, 1.0], CONFIG)
    with pytest.raises(ValueError):
        centered_clip([torch.ones(8), torch.zeros(8)], [0.0, 0.0], CONFIG)


def test_a_slotted_part_gives_each_slot_its_owners_value_and_names_who_writes_elsewhere():
    """Three senders own positions 0, 1, 2 modulo 3 (a roll of counts): each position comes back as
    its owner's value over three, what a plain mean of honest slots gives; sender 1 writes into
    sender 0's slot and sender 2 a NaN in its own: both are named and count as zeros."""
    parts = [torch.zeros(9) for _ in range(3)]
    parts[0][0], parts[0][3] = 30.0, 6.0
    parts[1][1], parts[1][0] = 60.0, 999.0
    parts[2][2] = math.nan
    result = slotted_centre(parts, [0, 1, 2], 3)
    assert result.value.tolist() == [10.0, 0, 0, 2.0, 0, 0, 0, 0, 0]
    assert result.outliers == (1, 2)
    honest = [torch.zeros(9) for _ in range(3)]
    for s, value in enumerate((30.0, 60.0, 90.0)):
        honest[s][s] = value
    assert torch.equal(slotted_centre(honest, [0, 1, 2], 3).value, sum(honest) / 3)


def test_a_sender_claiming_a_huge_weight_counts_for_at_most_max_weight_ratio_medians():
    generator = torch.Generator().manual_seed(5)
    honest = [torch.randn(256, generator=generator) for _ in range(5)]
    attacker = torch.full((256,), 50.0)
    config = RobustConfig()
    result = centered_clip([*honest, attacker], [1.0] * 5 + [1e9], config)
    plain = sum(honest) / 5
    # capped at 2 medians (a minority of the weight), then named and dropped
    assert float(torch.linalg.vector_norm(result.value - plain)) < float(
        torch.linalg.vector_norm(attacker - plain)
    )
    assert 5 in result.outliers


def test_a_reply_far_longer_than_ones_own_part_or_against_it_is_implausible():
    own = _honest(1, size=65536, seed=9)[0]
    centre = own + 0.5 * torch.randn(65536, generator=torch.Generator().manual_seed(1))
    assert implausible_reply(own, centre) is None
    assert "x the length" in implausible_reply(own, centre * 1000)
    assert "against this member's part" in implausible_reply(own, -centre)
    assert "not finite" in implausible_reply(own, torch.full_like(own, math.nan))
    # a broadcast's follower sends zeros, and short parts are not judged
    assert implausible_reply(torch.zeros(65536), centre * 1000) is None
    assert implausible_reply(own[:100], -centre[:100]) is None
    # short of the direction bound, only the length is judged
    assert implausible_reply(own[:4096], -centre[:4096]) is None
    assert implausible_reply(own[:4096], 1000 * centre[:4096]) is not None


def test_in_a_group_of_three_no_sender_holds_half_the_weight():
    """Twice the median is more than the two others together when the lightest is below the median:
    a x1000 sender claiming 4x a late peer's samples owned the weighted median (measured on the
    emulated internet: the honest reducer's reply came back 263 times too long)."""
    generator = torch.Generator().manual_seed(3)
    late, honest = (torch.randn(4096, generator=generator) for _ in range(2))
    attacker = 1000 * torch.randn(4096, generator=generator)
    weights = [32.0, 64.0, 128.0]
    capped = capped_weights(torch.tensor(weights, dtype=torch.float64), RobustConfig().max_weight_ratio)
    assert float(capped.max()) < float(capped.sum()) / 2
    result = centered_clip([late, honest, attacker], weights, RobustConfig())
    assert float(torch.linalg.vector_norm(result.value)) < 2 * float(torch.linalg.vector_norm(honest))
    # four senders keep the usual cap: twice the median (the lower middle) is a minority there
    four = torch.tensor([32.0, 64.0, 64.0, 1e9], dtype=torch.float64)
    assert capped_weights(four, 2.0).tolist() == [32.0, 64.0, 64.0, 128.0]


def test_a_broadcast_part_comes_back_byte_for_byte_once_its_negative_zeros_are_gone():
    """A broadcast: the head sends its vector with weight 1, members zeros with weight 0. The value
    comes back equal but a -0.0 comes back +0.0 (a reducer's sum starts from +0.0): different bytes,
    a different digest, an honest head named a liar. Without negative zeros the bytes are the head's."""
    head = torch.tensor([-0.0, 1.5, -2.0, 0.0] * 8)
    zeros = torch.zeros_like(head)
    back = centered_clip([head, zeros, zeros], [1.0, 0.0, 0.0], RobustConfig()).value
    assert torch.equal(back, head) and back.numpy().tobytes() != head.numpy().tobytes()
    (clean,) = without_negative_zeros([head])
    back = centered_clip([clean, zeros, zeros], [1.0, 0.0, 0.0], RobustConfig()).value
    assert back.numpy().tobytes() == clean.numpy().tobytes()
    assert torch.equal(clean, head) and not bool(torch.signbit(clean[0]))
    (same,) = without_negative_zeros([head.clone()], in_place=True)
    assert same.numpy().tobytes() == clean.numpy().tobytes()
