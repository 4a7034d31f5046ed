"""Rare outer steps between cohorts (``sync = "outer"``): DiLoCo's outer loop on MANTA's hierarchy.

In ``every-step`` tasks every round's gradient crosses the wide-area links. In ``outer`` tasks a
round (an *inner* step) averages inside the cohort only, exactly as before, over the cohort's cheap
links; the cohorts drift apart. Every ``inner_steps`` rounds they meet in an *outer step*:

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
    """What a peer carries from one outer step to the next (CPU tensors shaped like the parameters).

    ``global_params`` and ``momentum`` are the swarm's: identical on every peer after each outer
    step, and under the state's digest. ``anchor`` and ``residue`` are the cohort's: the parameters
    its current period started from (its progress since is ``anchor - params``) and what compression
    left out of its earlier exchanges. Without overlap the anchor is the global parameters."""

    global_params: list[torch.Tensor]
    momentum: list[torch.Tensor]
    anchor: list[torch.Tensor]
    residue: list[torch.Tensor]

    @classmethod
    def starting_at(cls, params: Sequence[torch.Tensor]) -> OuterState:
        return cls(
            [p.detach().clone() for p in params],
            [torch.zeros_like(p) for p in params],
            [p.detach().clone() for p in params],
            [torch.zeros_like(p) for p in params],
        )

    def outgoing(
        self, params: Sequence[torch.Tensor], compression: str
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """``(sent, residue)``: the period's pseudo-gradient with the residue added, as the codec
        delivers it (what every receiver decodes), and the residue left if that is what the swarm
        averages. Members of one cohort hold the same parameters, anchor and residue: they send the
        same bytes."""
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
    """The state a peer serves and digests: the workers' consensus tensors, the global parameters and
    the outer momentum (identical across the swarm after an outer step), then the rest of the
    workers' state, the anchor and the residue (neither covered by the digest)."""
    if outer is None:
        return list(worker_state)
    return [
        *worker_state[:consensus], *outer.global_params, *outer.momentum,
        *worker_state[consensus:], *outer.anchor, *outer.residue,
    ]  # fmt: skip


def served_consensus(consensus: int, outer: OuterState | None) -> int:
    """How many leading tensors of :func:`served_layout` the digest covers."""
    return consensus if outer is None else consensus + 2 * len(outer.global_params)


def split_served(
    tensors: Sequence[torch.Tensor], consensus: int, worker_count: int, params: int
) -> tuple[list[torch.Tensor], OuterState | None]:
    """Undo :func:`served_layout`: the workers' state (``worker_count`` tensors) and the outer state
    (None when the layout has none: ``every-step`` tasks)."""
    if len(tensors) == worker_count:
        return list(tensors), None
    if len(tensors) != worker_count + 4 * params:
        raise ValueError(
            f"state: {len(tensors)} tensors, expected {worker_count} or {worker_count + 4 * params}"
        )
    n, rest = params, worker_count - consensus
    cut = [consensus, consensus + n, consensus + 2 * n, consensus + 2 * n + rest, consensus + 3 * n + rest]
    head, global_params, momentum, tail = (
        tensors[:consensus],
        tensors[cut[0] : cut[1]],
        tensors[cut[1] : cut[2]],
        tensors[cut[2] : cut[3]],
    )
    anchor, residue = tensors[cut[3] : cut[4]], tensors[cut[4] :]
    return [*head, *tail], OuterState(list(global_params), list(momentum), list(anchor), list(residue))
