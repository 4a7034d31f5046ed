"""Robust aggregation for the all-reduce: CenteredClip over the parts every sender sent for one slice
of the vector, as BTARD does it, with parts that are not finite refused.

hivemind's reducer sums ``part * weight`` and divides by the summed weight. One sender is enough to
move that average anywhere (a part scaled ×1000, or of the wrong sign) or to poison it (one NaN makes
the whole part NaN), and every member then applies the same wrong result. Here a reducer keeps each
sender's part of the current slice and, once all of them are in, takes a robust centre instead:

1. parts with a NaN or an infinity (or a weight that is not a finite number >= 0) are refused;
2. the start is the coordinate-wise weighted median, which a minority cannot drag outside the range
   of the honest values in any coordinate (of two parts, their midpoint whatever their weights);
3. the clipping radius is ``tau`` times the weighted median distance of the parts to that start: a
   multiple of the honest spread, whatever the scale of the values (scale-free); of two parts,
   ``tau`` times half their distance, so two honest parts give their weighted mean;
4. CenteredClip iterates ``v <- v + sum_i w_i (x_i - v) min(1, radius / |x_i - v|) / sum_i w_i``: a
   part within the radius counts fully, one beyond it pulls by at most the radius times its weight;
5. parts farther than ``drop_factor × radius`` from that centre are dropped, and the centre is
   taken again from the others (clipping alone would still let each of them pull the result by a
   radius times its weight share); of those, parts farther than ``outlier_factor × radius`` are also
   named outliers (a part that far out is not an honest one). Dropping costs an honest part that
   lies out (a batch with a hard example) only its say in one centre; naming costs its sender the
   round's credit, so it is kept for parts no honest batch gives.

The reducer is trusted by nobody: a member checks each reply against the part it sent
(:func:`robust_aggregation.reply_check.implausible_reply`) and refuses one that no honest centre can
be. Over rounds, each sender's direction is kept by :mod:`robust_aggregation.alignment`: a sender
that keeps pointing against the others is left out of the centres and named.

When no remaining part lies beyond the radius from their weighted mean, that mean is the fixed point
of step 4 and is returned as computed in float64 (then cast): an honest swarm keeps its numbers.
Everything is deterministic (no randomness; sorts are stable, so ties go by index).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

import torch

from robust_aggregation.alignment import Alignment

# CenteredClip stops early once a step moves the centre by less than this fraction of the radius
# (about float32's resolution: the radius is at most a few times the parts' norms).
CONVERGED = 1e-7
# The radius is never below this many units in the last place of the start's norm: parts that differ
# from an identical majority only by float rounding must not be clipped, let alone named outliers.
RADIUS_FLOOR_ULPS = 8.0
# Parts of fewer values are clipped but never have a finite part named or dropped (see centered_clip):
# below a few values, honest parts' distances do not concentrate, so one lying beyond 3 radii is common.
MIN_VALUES_TO_NAME = 16
# Suspected senders are left out of a centre only if this many parts remain (see centered_clip).
MIN_PARTS_TO_LEAVE_SUSPECTS_OUT = 3


@dataclass(frozen=True)
class RobustConfig:
    """How a reducer aggregates a part robustly.

    ``tau`` — the clipping radius as a multiple of the weighted median distance of the parts to their
    coordinate-wise weighted median. 2.0: that median distance is the typical honest distance (a
    minority cannot move a median past the honest values), and honest parts of a part-sized vector
    (thousands of values) lie within a few percent of it, so at twice it none of them is clipped and
    an honest group gets its plain mean. Smaller clips honest parts (a biased, Huber-like estimate);
    larger lets each attacker that stays just inside the radius pull further.

    ``iterations`` — at most this many CenteredClip steps (it stops earlier once converged). Each step
    shrinks the distance to the fixed point by about the clipped weight share, under 1/2 with an
    honest majority: 20 steps are far past float32 precision, at a cost of 20 passes over the part.

    ``drop_factor`` — a part farther than ``drop_factor × radius`` from the centre is left out of the
    result (dropped, not named). 3.0: early in training honest parts of a part-sized vector
    concentrate within it, so an honest group keeps its plain mean. A bad part between
    ``drop_factor`` and ``outlier_factor`` radii, clipped but kept, would pull the result by a radius
    times its weight share in every round it is sent; dropped, it pulls nothing. Must be between 1
    and ``outlier_factor``.

    ``outlier_factor`` — a part farther than ``outlier_factor × radius`` from the centre is an outlier
    (named, as well as dropped). 10.0, that is twenty typical honest distances. Early in training
    honest parts of a part-sized vector concentrate within 3; late in training they do not: most
    members' samples are all learned and their parts are small, while one whose batch holds a hard
    example sends a part several radii out. Naming a sender is a strong claim (its receipt earns
    nothing), while the attacks it is for lie far beyond 10 (x1000 and
    random garbage a hundred times a gradient's length); a part within it is clipped, pulling the
    result by at most a radius times its weight share, and one beyond ``drop_factor`` not at all.
    Must be >= 1.

    ``max_weight_ratio`` — no sender's weight counts for more than this many times the median weight.
    A weight is its sender's word (hivemind sends it beside the parts; MANTA weighs a mean by the
    samples behind it), and one sender claiming a huge weight would otherwise own every centre: the
    clipping holds only while the honest senders have most of the weight. 2.0: one sender of four
    then has at most 2/5 of it; in a group of three, where twice the median can be half the weight or
    more, the cap is the median (:func:`capped_weights`). The price is paid by honest senders above
    the cap (a GPU peer beside CPU peers counts as two of them): their means weigh less than their
    samples would say, which changes the variance of the average, not its expectation (every mean is
    an unbiased estimate of the same gradient).

    ``like_parts`` — the senders' parts estimate one vector, each with sampling noise that shrinks
    with its weight (data-parallel means). Members then hold a reducer's own part to the others'
    spread (:mod:`robust_aggregation.reducer_proof`, point 5). Off where parts differ by design (the
    cross-cohort stage of model-parallel rounds: each cohort's mean of its own sub-networks).
    """

    tau: float = 2.0
    iterations: int = 20
    drop_factor: float = 3.0
    outlier_factor: float = 10.0
    max_weight_ratio: float = 2.0
    like_parts: bool = True

    def __post_init__(self) -> None:
        if not (math.isfinite(self.tau) and self.tau > 0):
            raise ValueError(f"tau must be a positive number, not {self.tau}")
        if self.iterations < 1:
            raise ValueError(f"iterations must be at least 1, not {self.iterations}")
        if not (math.isfinite(self.outlier_factor) and self.outlier_factor >= 1):
            raise ValueError(f"outlier_factor must be a number >= 1, not {self.outlier_factor}")
        if not (math.isfinite(self.drop_factor) and 1 <= self.drop_factor <= self.outlier_factor):
            raise ValueError(
                f"drop_factor must be a number between 1 and outlier_factor ({self.outlier_factor}), "
                f"not {self.drop_factor}"
            )
        if not (math.isfinite(self.max_weight_ratio) and self.max_weight_ratio >= 1):
            raise ValueError(f"max_weight_ratio must be a number >= 1, not {self.max_weight_ratio}")


@dataclass(frozen=True)
class ClipResult:
    """``value``: the robust weighted centre (the inputs' shape and dtype). ``outliers``: indices of
    the parts refused (not finite) or named (farther than ``outlier_factor × radius`` from the centre
    the first pass found), ascending. ``dropped``: the parts left out of the centre for lying
    farther than ``drop_factor × radius`` from it, but not named, ascending. ``radius``: the
    clipping radius, in the parts' units.
    ``alignments``: per part, how it lies against the centre of the other parts (None for a part
    refused, of zero weight, or alone); its :attr:`Alignment.cosine` is the cosine.
    ``capped``: the weight of each part the cap rule counted, after it; ``in_centre``: the parts
    the final centre is the fixed point of (both by part index)."""

    value: torch.Tensor
    outliers: tuple[int, ...]
    radius: float
    alignments: tuple[Alignment | None, ...] = ()
    # what a reducer's proof lists (robust_aggregation.reducer_proof): the capped weight of every part
    # counted by the cap rule, and the parts in the final centre
    capped: dict[int, float] = field(default_factory=dict)
    in_centre: tuple[int, ...] = ()
    dropped: tuple[int, ...] = ()


def centered_clip(
    parts: Sequence[torch.Tensor],
    weights: Sequence[float],
    config: RobustConfig,
    excluded: Collection[int] = (),
) -> ClipResult:
    """The robust weighted centre of ``parts`` (see the module's docstring for the steps and why).

    Zero-weight parts (hivemind's followers send zeros with weight 0) take no part and are never
    outliers unless they are not finite. ``excluded`` parts (senders already suspected of pointing
    against the others) take no part in the centre either, unless fewer than three parts would be
    left; they are still measured. Raises ValueError if no part is finite with a weight > 0."""
    if len(parts) != len(weights) or not parts:
        raise ValueError(f"{len(parts)} parts with {len(weights)} weights")
    shape, dtype = parts[0].shape, parts[0].dtype
    if any(part.shape != shape for part in parts):
        raise ValueError("parts differ in shape")
    refused = [
        i
        for i, (part, weight) in enumerate(zip(parts, weights))
        if not (math.isfinite(weight) and weight >= 0 and bool(torch.isfinite(part).all()))
    ]
    usable = [i for i, weight in enumerate(weights) if weight > 0 and i not in refused]
    if not usable:
        raise ValueError("no part is finite with a positive weight")
    # Suspects are left out only where at least three parts remain, which can still outvote one bad
    # part. Of two, a weighted median is one of them or lies between, so one wrong suspicion of an
    # honest sender would hand the centre to whatever remains (an attacker's part included).
    kept = [i for i in usable if i not in excluded]
    active = kept if len(kept) >= MIN_PARTS_TO_LEAVE_SUSPECTS_OUT else usable
    x = torch.stack([parts[i].detach().reshape(-1).to(torch.float64) for i in active])
    w = torch.tensor([float(weights[i]) for i in active], dtype=torch.float64)
    w = capped_weights(w, config.max_weight_ratio)

    # Of two parts the median is their midpoint, whatever their weights: the weighted median of two
    # unequal weights is the heavier part, whose distance 0 would make the radius 0 and the centre it.
    median_weights = w if len(active) > 2 else torch.ones_like(w)
    start = _weighted_median(x, median_weights)
    distances_to_start = torch.linalg.vector_norm(x - start, dim=1)[:, None]
    radius = config.tau * float(_weighted_median(distances_to_start, median_weights))
    if dtype.is_floating_point:
        info = torch.finfo(dtype)
        radius = max(radius, RADIUS_FLOOR_ULPS * info.eps * float(torch.linalg.vector_norm(start)), info.tiny)

    centre = _clipped_centre(x, w, start, radius, config.iterations)
    distances = torch.linalg.vector_norm(x - centre, dim=1)
    far = distances > config.drop_factor * radius
    # Dropping parts presumes an honest majority: never drop half the weight or more, and keep at
    # least two parts that agree, more than are dropped. By weight alone, the lighter of two parts
    # would always be "far" (the weighted median is the heavier one, at distance 0), and an honest
    # cohort head would be named. Nor name a part of a few values: there the honest distances do not
    # concentrate (with 3 scalar parts, the median distance is the smaller of two gaps), so a far
    # part proves nothing; clipping still bounds it.
    near = int((~far).sum())
    if (
        bool(far.any())
        and float(w[~far].sum()) > float(w.sum()) / 2
        and near >= 2
        and near > int(far.sum())
        and x.shape[1] >= MIN_VALUES_TO_NAME
    ):
        centre = _clipped_centre(x[~far], w[~far], centre, radius, config.iterations)
        beyond = far.nonzero().flatten().tolist()
        named = [active[j] for j in beyond if float(distances[j]) > config.outlier_factor * radius]
        dropped = [active[j] for j in beyond if float(distances[j]) <= config.outlier_factor * radius]
    else:
        named, dropped = [], []
    left_out = set(usable) - set(active) | set(named) | set(dropped)
    alignments = _alignments(parts, usable, left_out, dict(zip(active, w.tolist())), centre, radius)
    return ClipResult(
        centre.to(dtype).reshape(shape),
        tuple(sorted(refused + named)),
        radius,
        alignments,
        capped=dict(zip(active, w.tolist())),
        in_centre=tuple(i for i in active if i not in left_out),
        dropped=tuple(dropped),
    )


def slotted_centre(parts: Sequence[torch.Tensor], senders: Sequence[int], num_senders: int) -> ClipResult:
    """The reduction of a *slotted* part (``senders[j]`` sent ``parts[j]``): each sender owns the
    positions congruent to its sender index modulo ``num_senders`` and writes zeros elsewhere, so
    each position has one value, its owner's. The result is that value divided by ``num_senders``
    (what a plain mean of the parts gives when every sender keeps to its slots: a cohort's roll of
    sample counts, :mod:`peer.averaging.known_cohort`). A robust centre of such a part would be wrong
    (its coordinate-wise median is zero), and it needs none: what a sender writes in another's slots
    is ignored, and the sender named; so is one whose own values are not finite (they count as zero)."""
    result = torch.zeros(parts[0].numel(), dtype=torch.float64)
    positions = torch.arange(parts[0].numel())
    named = []
    for j, (part, sender) in enumerate(zip(parts, senders)):
        values = part.detach().reshape(-1).to(torch.float64)
        own = positions % num_senders == sender
        if bool(values[~own].ne(0).any()) or not bool(torch.isfinite(values[own]).all()):
            named.append(j)
        else:
            result[own] = values[own] / num_senders
    return ClipResult(result.to(parts[0].dtype).reshape(parts[0].shape), tuple(named), 0.0)


def without_negative_zeros(tensors: list[torch.Tensor], *, in_place: bool = False) -> list[torch.Tensor]:
    """``tensors`` with every -0.0 made +0.0 (``t + 0.0``, into ``tensors`` themselves if
    ``in_place``; nothing else changes). A reducer's sum
    starts from +0.0 and -0.0 + 0.0 is +0.0 in IEEE arithmetic, so a -0.0 that a broadcast's head
    sends arrives as +0.0 however exact the rest is: equal values, different bytes, a different
    digest, and members would bar an honest head whose broadcast differs from the digest it announced.
    A head sends what reducers give back."""
    return [t.add_(0.0) if in_place else t + 0.0 for t in tensors]


def capped_weights(w: torch.Tensor, max_weight_ratio: float) -> torch.Tensor:
    """``w`` with no weight above ``max_weight_ratio`` times the median, nor above the median where
    that would leave one sender half the weight or more. In a group of three, twice the median is
    more than the other two together whenever the lightest is below the median, so one sender
    claiming a large weight would own the weighted median of the part."""
    median = float(torch.median(w))  # the lower middle value for an even count
    capped = w.clamp(max=max_weight_ratio * median)
    heaviest = float(capped.max())
    if len(w) >= 3 and heaviest >= float(capped.sum()) - heaviest:
        capped = w.clamp(max=median)
    return capped


def _alignments(parts, usable, left_out, weight_of, centre, radius) -> tuple[Alignment | None, ...]:
    """Each usable part against the centre of the others. For a part in the centre, the others'
    centre is the mean of the other parts in it, each with the weight it has in the centre: its
    weight times its clip factor ``min(1, radius / |x - centre|)`` (at CenteredClip's fixed point
    the centre is exactly that weighted mean). Taking a clipped part's whole weighted value out of the
    centre instead would leave the others' centre pointing away from it, and an honest member whose
    batch holds a hard example would read anti-aligned. For a part left out of the centre, the
    others' centre is the centre itself."""
    result: list[Alignment | None] = [None] * len(parts)
    if len(usable) < 2:
        return tuple(result)
    inside = [i for i in weight_of if i not in left_out]
    values = {i: parts[i].detach().reshape(-1).to(torch.float64) for i in usable}
    counted = {}
    for i in inside:
        distance = float(torch.linalg.vector_norm(values[i] - centre))
        counted[i] = weight_of[i] * (min(1.0, radius / distance) if distance > 0 else 1.0)
    total = sum(counted.values())
    weighted = torch.zeros_like(centre)
    for i in sorted(counted):  # in index order: every reducer sums the same way
        weighted.add_(values[i], alpha=counted[i])
    for i in usable:
        x = values[i]
        if i in left_out:
            others = centre
        elif (rest := total - counted[i]) > 0:
            others = (weighted - x * counted[i]) / rest
        else:
            continue
        result[i] = Alignment(
            float(torch.dot(x, others)), float(torch.dot(x, x)), float(torch.dot(others, others))
        )
    return tuple(result)


def _weighted_median(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Coordinate-wise weighted median of the rows of ``x`` (k, d) with weights ``w`` (k,): in each
    coordinate the value where the cumulated weight reaches half; where it reaches exactly half, the
    midpoint of that value and the next (so two equal-weight parts give their mean)."""
    k, by_coordinate = x.shape[0], x.t().contiguous()  # sorting runs faster along contiguous rows
    if bool((w == w[0]).all()):  # equal weights (the usual case): the ranks say where half is
        values = torch.sort(by_coordinate, dim=1).values
        return (values[:, (k - 1) // 2] + values[:, k // 2]) / 2
    values, order = torch.sort(by_coordinate, dim=1, stable=True)
    cumulated = torch.cumsum(w[order], dim=1)
    half = float(w.sum()) / 2
    # argmax returns the first maximal index: the first rank whose cumulated weight reaches (passes) half
    lower = (cumulated >= half).to(torch.int8).argmax(dim=1, keepdim=True)
    upper = (cumulated > half).to(torch.int8).argmax(dim=1, keepdim=True)
    return ((values.gather(1, lower) + values.gather(1, upper)) / 2).squeeze(1)


def _weighted_mean(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """sum_i w_i x_i / sum_i w_i in float64, summed in row order (not by a BLAS kernel whose order
    depends on the machine), so every reducer computes the same bits from the same parts."""
    total = torch.zeros_like(x[0])
    for row, weight in zip(x, w.tolist()):
        total.add_(row, alpha=weight)
    return total / float(w.sum())


def _clipped_centre(x: torch.Tensor, w: torch.Tensor, start: torch.Tensor, radius: float, iterations: int):
    """The CenteredClip fixed point over the rows of ``x``: their weighted mean if every row lies within
    ``radius`` of it (the mean is then the fixed point), else the iterate from ``start``."""
    mean = _weighted_mean(x, w)
    if bool((torch.linalg.vector_norm(x - mean, dim=1) <= radius).all()):
        return mean
    total, centre = float(w.sum()), start
    for _ in range(iterations):
        offsets = x - centre
        distances = torch.linalg.vector_norm(offsets, dim=1)
        scale = torch.where(distances > radius, radius / distances.clamp_min(1e-300), 1.0)
        step = _weighted_mean(offsets, w * scale) * (float((w * scale).sum()) / total)
        centre = centre + step
        if float(torch.linalg.vector_norm(step)) <= CONVERGED * radius:
            break
    return centre
