"""Robust aggregation for the all-reduce: CenteredClip over the parts every sender sent for one slice
of the vector, as BTARD does it, with parts that are not finite refused.

hivemind's reducer sums ``part * weight`` and divides by the summed weight. One sender is enough to
move that average anywhere (a part scaled ×1000, or of the wrong sign) or to poison it (one NaN makes
the whole part NaN), and every member then applies the same wrong result. Here a reducer keeps each
sender's part of the current slice and, once all of them are in, takes a robust centre instead:

1. parts with a NaN or an infinity (or a weight that is not a finite number >= 0) are refused;
2. the start is the coordinate-wise weighted median, which a minority cannot drag outside the range
   of the honest values in any coordinate;
3. the clipping radius is ``tau`` times the weighted median distance of the parts to that start: a
   multiple of the honest spread, whatever the scale of the values (scale-free);
4. CenteredClip iterates ``v <- v + sum_i w_i (x_i - v) min(1, radius / |x_i - v|) / sum_i w_i``: a
   part within the radius counts fully, one beyond it pulls by at most the radius times its weight;
5. parts farther than ``drop_factor × radius`` from that centre are dropped, and the centre is
   taken again from the others (clipping alone would still let each of them pull the result by a
   radius times its weight share); of those, parts farther than ``outlier_factor × radius`` are also
   named outliers (a part that far out is not an honest one). Dropping costs an honest part that
   lies out (a batch with a hard example) only its say in one centre; naming costs its sender the
   round's credit, so it is kept for parts no honest batch gives.

The reducer is trusted by nobody: a member checks each reply against the part it sent
(:func:`hivemind_adapter.reply_check.implausible_reply`) and refuses one that no honest centre can be. Over rounds, each sender's
direction is kept by :mod:`hivemind_adapter.alignment`: a sender that keeps pointing against the
others is left out of the centres and named.

When no remaining part lies beyond the radius from their weighted mean, that mean is the fixed point
of step 4 and is returned as computed in float64 (then cast): an honest swarm keeps its numbers.
Everything is deterministic (no randomness; sorts are stable, so ties go by index).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field

import torch
from hivemind.averaging.partition import AllreduceException, BannedException, TensorPartReducer

from hivemind_adapter.alignment import Alignment
from hivemind_adapter.reducer_proof import make_proof, noise_level, sketch_seed

# CenteredClip stops early once a step moves the centre by less than this fraction of the radius
# (about float32's resolution: the radius is at most a few times the parts' norms).
CONVERGED = 1e-7
# The radius is never below this many units in the last place of the start's norm: parts that differ
# from an identical majority only by float rounding must not be clipped, let alone named outliers.
RADIUS_FLOOR_ULPS = 8.0
# Parts of fewer values are clipped but never have a finite part named or dropped (see centered_clip).
# Measured on honest Gaussian parts from 3-16 senders (200-300 groups each): with 1 value, up to a
# quarter of the groups had a part beyond 3 radii; with 5 values, 1%; from 8 values on, none.
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
    concentrate within it, so an honest group keeps its plain mean. A bad part between 3 and 10
    radii, clipped but kept, pulls the result by a radius times its weight share in every round it
    is sent. With dropping and naming both at 10, random garbage (100x a gradient's length; 0.8 %
    of its values lay between 3 and 10 radii) pulled each update by a median 0.70 honest peers and
    cost the largest sub-network 0.56 +- 0.24 pp after 120 rounds; dropped at 3, 0.21 and
    0.16 +- 0.23 pp (benchmarks/README.md at 7085eb3, "Dropping at 3 radii, naming beyond 10"). Must be
    between 1 and ``outlier_factor``.

    ``outlier_factor`` — a part farther than ``outlier_factor × radius`` from the centre is an outlier
    (named, as well as dropped). 10.0, that is twenty typical honest distances. Early in
    training honest parts of a part-sized vector concentrate within 3; late in training they do not:
    most members' samples are all learned and their parts are small, while one whose batch holds a
    hard example sends a part several radii out. In two clean 120-round runs of the red team's task
    honest parts reached 5.3 radii, and at 3.0 honest members were named in 66 parts from round 60
    on (benchmarks/README.md at 7085eb3, "Honest members named late in training"). Naming a sender is a strong
    claim (its receipt earns nothing), while the attacks it is for lie far beyond 10 (x1000 and
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
    samples would say, which changes the variance of the average, not its expectation (every mean is an unbiased
    estimate of the same gradient).

    ``like_parts`` — the senders' parts estimate one vector, each with sampling noise that shrinks
    with its weight (data-parallel means). Members then hold a reducer's own part to the others'
    spread (:mod:`hivemind_adapter.reducer_proof`, point 5). Off where parts differ by design (the
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
    # what a reducer's proof lists (hivemind_adapter.reducer_proof): the capped weight of every part
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
    # honest sender hands the centre to whatever remains. Measured on the emulated internet: in a
    # cohort of three, an honest member's direction record (soured by an x1000 sender in the first
    # attempt) left out the other honest member, and its centre came out as the mean of its own
    # part and the x1000 one, 507 times too long; its cohort mates refused it and barred it.
    kept = [i for i in usable if i not in excluded]
    active = kept if len(kept) >= MIN_PARTS_TO_LEAVE_SUSPECTS_OUT else usable
    x = torch.stack([parts[i].detach().reshape(-1).to(torch.float64) for i in active])
    w = torch.tensor([float(weights[i]) for i in active], dtype=torch.float64)
    w = capped_weights(w, config.max_weight_ratio)

    start = _weighted_median(x, w)
    radius = config.tau * float(_weighted_median(torch.linalg.vector_norm(x - start, dim=1)[:, None], w))
    if dtype.is_floating_point:
        info = torch.finfo(dtype)
        radius = max(radius, RADIUS_FLOOR_ULPS * info.eps * float(torch.linalg.vector_norm(start)), info.tiny)

    centre = _clipped_centre(x, w, start, radius, config.iterations)
    distances = torch.linalg.vector_norm(x - centre, dim=1)
    far = distances > config.drop_factor * radius
    # Dropping parts presumes an honest majority: never drop half the weight or more, and keep at
    # least two parts that agree, more than are dropped. By weight alone, the lighter of two parts was
    # always "far" (the weighted median is the heavier one, at distance 0): on the emulated internet
    # the lighter of two cohorts' heads was named in most cross-cohort stages, and its receipts were
    # refused. Nor name a part of a few values: there the honest distances do not concentrate (with 3
    # scalar parts, the median distance is the smaller of two gaps), so a far part proves nothing;
    # clipping still bounds it.
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
    sample counts, :mod:`peer.known_cohort`). A robust centre of such a part would be wrong (its
    coordinate-wise median is zero), and it needs none: what a sender writes in another's slots is
    ignored, and the sender named; so is one whose own values are not finite (they count as zero)."""
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


def without_negative_zeros(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """``tensors`` with every -0.0 made +0.0 (``t + 0.0``; nothing else changes). A reducer's sum
    starts from +0.0 and -0.0 + 0.0 is +0.0 in IEEE arithmetic, so a -0.0 that a broadcast's head
    sends arrives as +0.0 however exact the rest is: equal values, different bytes, a different
    digest. Measured on the emulated internet: both members of an honest head saw its broadcast
    differ from the digest it announced, and barred it. A head sends what reducers give back."""
    return [t + 0.0 for t in tensors]


def capped_weights(w: torch.Tensor, max_weight_ratio: float) -> torch.Tensor:
    """``w`` with no weight above ``max_weight_ratio`` times the median, nor above the median where
    that would leave one sender half the weight or more. In a group of three, twice the median is
    more than the other two together whenever the lightest is below the median: measured on the
    emulated internet, an x1000 sender claiming 4x the samples of a peer that had caught up late owned
    the weighted median of its honest reducer's part, whose reply came back 263 times too long; its
    two honest cohort mates refused each other's replies and barred each other for 10 minutes."""
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
    the centre is exactly that weighted mean). Taking a clipped part's whole weighted value out of
    the centre instead, as this once did, left the others' centre pointing away from it: late in
    training, when a member's 64 samples hold a hard example and its part is clipped, honest members
    read anti-aligned and were left out (one of three causes of honest members named late in
    training: benchmarks/README.md at 7085eb3, "Honest members named late in training"). For a part left out
    of the centre, the others' centre is the centre itself."""
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
    k, by_coordinate = x.shape[0], x.t().contiguous()  # sorting along contiguous rows is ~3x faster
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


class RobustPartReducer(TensorPartReducer):
    """hivemind's reducer, but each part's result is :func:`centered_clip` of what the senders sent.

    hivemind accumulates a part's sum as senders' parts arrive; a robust centre needs them all at
    once, so this keeps each sender's part (and weight) of the current part index, and reduces when
    every sender still counted for that index has sent it (the same bookkeeping as hivemind's:
    ``num_parts_received``, ``sender_failed_after``, ``on_sender_failed``). The inputs of a part are
    freed as soon as its result is set: at most one part index per sender is held.

    One difference: a part counts as received once it is held, not as soon as it arrives. hivemind
    counts a part that still waits for the previous one to finish; if its sender's stream is then
    cancelled, the sender is dropped only after that part, which nobody will ever send (the part
    waits for it until the all-reduce's timeout).

    ``outliers`` maps a sender index to the part indices on which it was refused or named;
    ``dropped``, to those on which its part was left out for lying beyond ``drop_factor`` radii
    but not named.
    ``alignments`` holds each sender's cosine with the others' centres over this reducer's whole
    share (its parts of at least ``min_aligned_values`` values together; by sender index): one
    cosine per sender and all-reduce. Not one per part: a sender's parts of one all-reduce come from
    one batch, and late in training a batch with a hard example points against the others in most
    of them at once; a record window of per-part cosines then held one round's evidence, and honest
    members were named (benchmarks/README.md at 7085eb3, "Honest members named late in training").
    ``excluded`` senders (suspected by an
    :class:`~hivemind_adapter.alignment.AlignmentRecord`) are left out of every centre.
    ``slotted_parts`` (part indices) are reduced by :func:`slotted_centre`, not robustly: the
    cohort's roll of sample counts, each member's in its own slot.
    Parts are cast to ``part_dtype`` (default: torch's default dtype, the dtype hivemind's reducer
    averages in); a part of the wrong shape is refused and its sender is dropped like a failed one.
    """

    def __init__(
        self,
        part_shapes: Sequence[torch.Size],
        num_senders: int,
        config: RobustConfig,
        part_dtype: torch.dtype | None = None,
        excluded: Collection[int] = (),
        min_aligned_values: int = 1024,
        slotted_parts: Collection[int] = (),
        proof_context: bytes | None = None,
        as_received: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ):
        self.config = config
        # With a context (the all-reduce's group id and this reducer), every robust part's result comes
        # with a proof that members check (hivemind_adapter.reducer_proof); ``as_received`` gives what
        # members decode of a result (the wire's codec), which the proof must speak of.
        self.proof_context = proof_context
        self.as_received = as_received or (lambda t: t)
        self.proofs: dict[int, bytes] = {}  # part index -> its proof (b"" for a slotted part)
        self.noise_levels: dict[int, float] = {}  # part index -> reducer_proof.noise_level of its proof
        self.slotted_parts = frozenset(slotted_parts)
        self.part_dtype = part_dtype or torch.get_default_dtype()
        self.excluded = frozenset(excluded)
        self.min_aligned_values = min_aligned_values
        self.outliers: dict[int, set[int]] = {}
        self.dropped: dict[int, set[int]] = {}
        self._alignment_sums: dict[int, Alignment] = {}  # sender index -> over its parts so far
        self._inputs: dict[int, tuple[torch.Tensor, float]] = {}  # sender index -> its current part, weight
        self._reducing: asyncio.Task | None = None  # the current part's reduction, while it runs
        super().__init__(part_shapes, num_senders)  # calls reset_accumulators

    @property
    def alignments(self) -> list[dict[int, float]]:
        """Each sender's cosine over this reducer's share so far, as one record entry (empty before
        any part of at least ``min_aligned_values`` values was reduced)."""
        cosines = {i: c for i, a in sorted(self._alignment_sums.items()) if (c := a.cosine) is not None}
        return [cosines] if cosines else []

    def reset_accumulators(self) -> None:
        if self.current_part_index >= self.num_parts - 1:
            self.finalize()
            return
        self.current_part_index += 1
        self.current_part_accumulated_from = 0
        self.current_part_future = asyncio.Future()
        # senders that failed before this part are not waited for (they failed after fewer parts)
        self.num_current_senders = sum(self.current_part_index < after for after in self.sender_failed_after)
        self._inputs = {}
        self.accumulator = None  # hivemind's finalize deletes it; nothing is accumulated here

    async def accumulate_part(
        self, sender_index: int, part_index: int, tensor_part: torch.Tensor, weight: float = 1.0
    ) -> torch.Tensor:
        """Hold ``tensor_part`` until every counted sender sent its part ``part_index``, then return the
        robust centre (the same tensor to every sender of that part)."""
        if not (0 <= sender_index < self.num_senders and 0 <= part_index < self.num_parts):
            raise AllreduceException(f"no sender {sender_index} or part {part_index} in this reducer")
        if tensor_part.shape != self.part_shapes[part_index]:
            # not counted as received: the caller drops this sender from this part on
            raise AllreduceException(
                f"sender {sender_index} sent part {part_index} of shape {tuple(tensor_part.shape)}, "
                f"not {tuple(self.part_shapes[part_index])}"
            )
        while part_index > self.current_part_index:  # earlier parts are still being gathered
            finished = asyncio.create_task(self.finished.wait())
            try:
                await asyncio.wait({self.current_part_future, finished}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                finished.cancel()
            if self.finished.is_set():
                raise AllreduceException(f"part {part_index} arrived after this reducer finished")
        if self.sender_failed_after[sender_index] != float("inf"):
            raise BannedException(f"sender {sender_index} was dropped")
        assert part_index == self.current_part_index, "a sender's parts arrive in order"
        future = self.current_part_future
        self.num_parts_received[sender_index] += 1
        self._inputs[sender_index] = (tensor_part.to(self.part_dtype), float(weight))
        self.current_part_accumulated_from += 1
        self.check_current_part_finished()
        return await future

    def check_current_part_finished(self) -> None:
        if self._reducing is not None:  # this part is being reduced already
            return
        assert self.current_part_accumulated_from <= self.num_current_senders
        if self.current_part_accumulated_from < self.num_current_senders:
            return
        if not self._inputs:  # every sender failed before this part: nobody waits for it
            self.current_part_future.cancel()
            self.reset_accumulators()
            return
        inputs, self._inputs = self._inputs, {}
        self._reducing = asyncio.create_task(
            self._reduce(inputs, self.current_part_future, self.current_part_index)
        )

    async def _reduce(
        self, inputs: dict[int, tuple[torch.Tensor, float]], future: asyncio.Future, part_index: int
    ):
        """Set ``future`` to the robust centre of ``inputs``, then move on to the next part. The centre
        is computed in a worker thread (50-130 ms for a 512 KiB part from 8 senders, measured): the loop
        keeps serving the other streams meanwhile. Later parts wait, as they do for hivemind's sum."""
        senders = sorted(inputs)  # by sender index, not arrival: the same inputs give the same bits
        parts, weights = [inputs[s][0] for s in senders], [inputs[s][1] for s in senders]
        del inputs
        try:
            value = None
            if part_index in self.slotted_parts:
                result = slotted_centre(parts, senders, self.num_senders)
                self.proofs[part_index] = b""  # each slot is its owner's value: members check their own
            else:
                excluded = [j for j, sender in enumerate(senders) if sender in self.excluded]
                loop = asyncio.get_running_loop()
                result = await loop.run_in_executor(
                    None, centered_clip, parts, weights, self.config, excluded
                )
                if self.proof_context is not None:
                    value, self.proofs[part_index] = await loop.run_in_executor(
                        None, self.answer, result, parts, senders, weights, part_index
                    )
        except Exception as e:  # no usable part (ValueError), or worse: this slice cannot be averaged
            for j, part in enumerate(parts):
                if not bool(torch.isfinite(part).all()):
                    self.outliers.setdefault(senders[j], set()).add(part_index)
            if not future.done():
                future.set_exception(AllreduceException(f"part {part_index}: {e}"))
        else:
            for j in result.outliers:
                self.outliers.setdefault(senders[j], set()).add(part_index)
            for j in result.dropped:
                self.dropped.setdefault(senders[j], set()).add(part_index)
            if parts[0].numel() >= self.min_aligned_values:
                for j, alignment in enumerate(result.alignments):
                    if alignment is not None:
                        known = self._alignment_sums.get(senders[j])
                        self._alignment_sums[senders[j]] = alignment if known is None else known + alignment
            if not future.done():  # not cancelled by finalize meanwhile
                future.set_result(result.value if value is None else value)
        finally:
            del parts
            self._reducing = None
            if not self.finished.is_set():
                self.reset_accumulators()

    def answer(
        self,
        result: ClipResult,
        parts: Sequence[torch.Tensor],
        senders: Sequence[int],
        weights: Sequence[float],
        part_index: int,
    ) -> tuple[torch.Tensor, bytes]:
        """What this reducer sends back for a part (its centre) and the proof that goes with it (runs
        in a worker thread; the red team's dishonest reducers override it)."""
        received = self.as_received(result.value)
        seed = sketch_seed(self.proof_context, part_index, received)
        proof = make_proof(
            dict(zip(senders, parts)),
            dict(zip(senders, weights)),
            self.num_senders,
            received,
            result.radius,
            {senders[j]: w for j, w in result.capped.items()},
            [senders[j] for j in result.in_centre],
            seed,
        )
        if (level := noise_level(proof)) is not None:
            self.noise_levels[part_index] = level
        return result.value, proof.to_bytes()

    def finalize(self) -> None:
        self._inputs = {}
        super().finalize()
