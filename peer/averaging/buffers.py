"""What a round's stages do to the averagers' shared buffer between all-reduces. The cohort
averager's buffer is the template's tensors plus the known-group roll (:mod:`.known_cohort`); the
cross-cohort averager shares the same tensors, without the roll."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hivemind_adapter.allreduce import VerifiedAverager
from peer.averaging.outcome import Contributor
from peer.averaging.stage import RoundAborted


def load(averager: VerifiedAverager, tensors: Sequence[torch.Tensor]) -> None:
    """Copy ``tensors`` into the buffer's first tensors."""
    with averager.get_tensors() as buf:
        for b, t in zip(buf, tensors):
            b.copy_(t)


def snapshot(averager: VerifiedAverager, count: int) -> list[torch.Tensor]:
    """A copy of the buffer's first ``count`` tensors (not the roll)."""
    with averager.get_tensors() as buf:
        return [b.clone() for b in buf[:count]]


def scale(averager: VerifiedAverager, count: int, factor: float) -> None:
    """Multiply the buffer's first ``count`` tensors by ``factor``."""
    with averager.get_tensors() as buf:
        for b in buf[:count]:
            b.mul_(factor)


def clear_roll(averager: VerifiedAverager) -> None:
    """Zeros in the roll: a count left in one member's slot would sit in another's in a matchmade
    group (and a robust reducer would name its sender for it)."""
    with averager.get_tensors() as buf:
        buf[-1].zero_()


def to_own_mean(averager: VerifiedAverager, count: int, samples: int) -> None:
    """The buffer's numerator becomes this peer's mean gradient (zeros without samples) and the roll
    zeros: every stage averages per-sample means weighted by their samples."""
    scale(averager, count, 1.0 / samples if samples > 0 else 0.0)
    clear_roll(averager)


def final_vector(
    averager: VerifiedAverager,
    contributors: Sequence[Contributor],
    cohorts: int,
    factor: float,
    per_cohort: bool,
) -> list[torch.Tensor]:
    """The round's vector from the cross stage's result: the sample-weighted mean over the
    contributors, or (``per_cohort``) the sum of cohort means times ``factor``. Every leader holds the
    same bytes and computes the same product. Raises :class:`RoundAborted` without samples."""
    if sum(c.samples for c in contributors) <= 0:
        raise RoundAborted("no samples were contributed")
    with averager.get_tensors() as buf:
        if per_cohort:  # buf = (sum of cohort means) / cohorts
            return [b * (cohorts * factor) for b in buf]
        return [b.clone() for b in buf]
