"""Rare outer steps between cohorts (``sync = "outer"``): DiLoCo's outer loop on MANTA's hierarchy.

In ``every-step`` tasks every round's gradient crosses the wide-area links. In ``outer`` tasks a
round (an *inner* step) averages inside the cohort only, exactly as before, over the cohort's cheap
links; the cohorts drift apart. Every ``inner_steps`` rounds they meet in an *outer step*:

1. each cohort's pseudo-gradient is ``anchor - params`` (the parameters at the last outer step minus
   the parameters now: the H inner steps' progress, as a descent direction), plus the error-feedback
   residue of earlier exchanges;
2. it goes through the task's compression (:mod:`hivemind_adapter.wire_codecs`); what the codec left
   out stays in the residue and is sent with the next outer step, so nothing is lost for good;
3. the cohorts average what they sent across the swarm (the hierarchy's cross stage, exact over
   whoever came, committed by a quorum like a round's result), weighted by their members;
4. every peer applies the same outer Nesterov step to the anchor and takes the result as its
   parameters, with a fresh inner optimizer state.

After a committed outer step every peer's consensus state (parameters, inner optimizer state, anchor,
outer momentum) is identical, so the round's commit board and catch-up check and carry it by digest
like any round's state: a peer that missed the step downloads it, and a late joiner receives the
outer momentum with it. The residue belongs to a cohort (its members send the same vector) and rides
along with the state, outside the digest.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from hivemind_adapter.wire_codecs import codec_for, roundtrip


@dataclass(frozen=True)
class OuterSettings:
    """The task's outer-step settings (``[swarm]`` ``inner_steps``, ``outer_lr``, ``outer_momentum``,
    ``outer_compression``)."""

    inner_steps: int
    lr: float
    momentum: float
    compression: str

    @classmethod
    def of_task(cls, params) -> OuterSettings | None:
        """The settings of a :class:`protocol.records.SwarmParams`; None for ``sync = "every-step"``."""
        if params.sync != "outer":
            return None
        return cls(
            params.inner_steps, float(params.outer_lr), float(params.outer_momentum), params.outer_compression
        )

    def is_boundary(self, round_index: int) -> bool:
        """Whether an outer step follows round ``round_index`` (rounds count from 0)."""
        return (round_index + 1) % self.inner_steps == 0


@dataclass
class OuterState:
    """What a peer carries from one outer step to the next (CPU tensors shaped like the parameters)."""

    anchor: list[torch.Tensor]  # the parameters every peer took at the last outer step
    momentum: list[torch.Tensor]  # the outer Nesterov buffer, identical on every peer
    residue: list[torch.Tensor]  # what compression left out of this cohort's earlier exchanges

    @classmethod
    def starting_at(cls, params: Sequence[torch.Tensor]) -> OuterState:
        return cls(
            [p.detach().clone() for p in params],
            [torch.zeros_like(p) for p in params],
            [torch.zeros_like(p) for p in params],
        )

    def outgoing(
        self, params: Sequence[torch.Tensor], compression: str
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """``(sent, residue)``: the pseudo-gradient with the residue added, as the codec delivers it
        (what every receiver decodes), and the residue left if that is what the swarm averages.
        Members of one cohort hold the same parameters, anchor and residue: they send the same bytes."""
        codec = codec_for(compression)
        sent, residue = [], []
        for a, p, r in zip(self.anchor, params, self.residue):
            wanted = (a - p) + r
            delivered = roundtrip(codec, wanted)
            sent.append(delivered)
            residue.append(wanted - delivered)
        return sent, residue


def nesterov_outer_step(
    anchor: Sequence[torch.Tensor],
    momentum: Sequence[torch.Tensor],
    average: Sequence[torch.Tensor],
    lr: float,
    mu: float,
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """``(params, momentum)`` after one outer step: SGD with Nesterov momentum on the averaged
    pseudo-gradient (PyTorch's SGD update, as DiLoCo uses it). Elementwise and deterministic, so
    every peer computes the same bytes from the same average."""
    new_params, new_momentum = [], []
    for a, m, g in zip(anchor, momentum, average):
        m = m * mu + g
        new_momentum.append(m)
        new_params.append(a - lr * (g + mu * m))
    return new_params, new_momentum


def served_layout(
    worker_state: Sequence[torch.Tensor], consensus: int, outer: OuterState | None
) -> list[torch.Tensor]:
    """The state a peer serves and digests: the workers' consensus tensors, the anchor and the outer
    momentum (all identical across the swarm after an outer step), then the rest of the workers'
    state and the residue (neither covered by the digest)."""
    if outer is None:
        return list(worker_state)
    return [
        *worker_state[:consensus],
        *outer.anchor,
        *outer.momentum,
        *worker_state[consensus:],
        *outer.residue,
    ]


def served_consensus(consensus: int, outer: OuterState | None) -> int:
    """How many leading tensors of :func:`served_layout` the digest covers."""
    return consensus if outer is None else consensus + 2 * len(outer.anchor)


def split_served(
    tensors: Sequence[torch.Tensor], consensus: int, worker_count: int, params: int
) -> tuple[list[torch.Tensor], OuterState | None]:
    """Undo :func:`served_layout`: the workers' state (``worker_count`` tensors) and the outer state
    (None when the layout has none: ``every-step`` tasks)."""
    if len(tensors) == worker_count:
        return list(tensors), None
    if len(tensors) != worker_count + 3 * params:
        raise ValueError(
            f"state: {len(tensors)} tensors, expected {worker_count} or {worker_count + 3 * params}"
        )
    anchor = list(tensors[consensus : consensus + params])
    momentum = list(tensors[consensus + params : consensus + 2 * params])
    rest = list(tensors[consensus + 2 * params : consensus + 2 * params + worker_count - consensus])
    residue = list(tensors[consensus + 2 * params + worker_count - consensus :])
    return [*tensors[:consensus], *rest], OuterState(anchor, momentum, residue)
