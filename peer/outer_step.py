"""Rare outer steps between cohorts (``sync = "outer"``): DiLoCo's outer loop on MANTA's hierarchy.

In ``every-step`` tasks every round's gradient crosses the wide-area links. In ``outer`` tasks a
round (an *inner* step) averages inside the cohort only (the cohort stage alone), over the cohort's
cheap links; the cohorts drift apart. Every ``inner_steps`` rounds they meet in an *outer step*:

1. each cohort's pseudo-gradient is ``anchor - params`` (the parameters the period started from minus
   the parameters now: its inner steps' progress, as a descent direction), plus the error-feedback
   residue of earlier exchanges;
2. it goes through the task's compression (:mod:`hivemind_adapter.wire_codecs`); what the codec left
   out stays in the residue and is sent with the next outer step, so nothing is lost for good;
3. the cohorts average what they sent across the swarm (the hierarchy's cross stage, exact over
   whoever came, committed by a quorum like a round's result), weighted by their members;
4. every peer applies the same outer Nesterov step to the *global parameters* (``outer_lr``,
   ``outer_momentum``): the swarm's model, identical everywhere.

Blocking (``outer_overlap = false``), every peer then takes the global parameters with a fresh inner
optimizer state: its whole consensus state is the swarm's, and the round's commit board and catch-up
check and carry it by digest like any round's state. Overlapped (the default,
:mod:`peer.outer_round`), the exchange runs during the next period and its step lands one period late:
a cohort's parameters are the global parameters plus its own progress since, and what every peer
shares, checked by digest in every exchange's group key and recorded after every step, is the global
parameters and the outer momentum. Both travel with a served state, under its digest, so a late
joiner receives the outer momentum; the anchor and the residue (the cohort's) travel outside it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from hivemind_adapter.wire_codecs import codec_for, roundtrip
from supernet.outer_state import OuterState


@dataclass(frozen=True)
class OuterSettings:
    """The task's outer-step settings (``[swarm]`` ``inner_steps``, ``outer_lr``, ``outer_momentum``,
    ``outer_compression``)."""

    inner_steps: int
    lr: float
    momentum: float
    compression: str
    overlap: bool = True  # the exchange runs during the next period, its step applied one period late

    @classmethod
    def of_task(cls, params) -> OuterSettings | None:
        """The settings of a :class:`protocol.task_spec.SwarmParams`; None for ``sync = "every-step"``."""
        if params.sync != "outer":
            return None
        return cls(
            params.inner_steps, float(params.outer_lr), float(params.outer_momentum), params.outer_compression
        )

    def is_boundary(self, round_index: int) -> bool:
        """Whether an outer step follows round ``round_index`` (rounds count from 0)."""
        return (round_index + 1) % self.inner_steps == 0

    def period_of(self, round_index: int) -> int:
        """The outer period round ``round_index`` belongs to (from 0): its exchange's attempt number."""
        return round_index // self.inner_steps


def outgoing(
    state: OuterState, params: Sequence[torch.Tensor], compression: str
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """``(sent, residue)``: the period's pseudo-gradient (``anchor - params``) with the residue added,
    as the codec delivers it (what every receiver decodes), and the residue left if that is what the
    swarm averages. Members of one cohort hold the same parameters, anchor and residue: they send the
    same bytes."""
    codec = codec_for(compression)
    sent, residue = [], []
    for a, p, r in zip(state.anchor, params, state.residue):
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
