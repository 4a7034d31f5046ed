"""The state an outer task's peer carries between outer steps (``sync = "outer"``), and the layout a
served state has with it: shared by peers (:mod:`peer.outer_step` computes the steps), the aggregator
(its checkpoints and audits fetch served states) and tools. Pure tensors: no networking."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from supernet.state import digest


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


def outer_digest(state: OuterState) -> str:
    """Digest of what every peer shares between outer steps: global parameters and outer momentum
    (the key an outer exchange's groups are formed by, and what a missed step is checked against)."""
    return digest([*state.global_params, *state.momentum])


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


def adopted_state(
    served_worker: Sequence[torch.Tensor],
    served_outer: OuterState | None,
    own_worker: Sequence[torch.Tensor],
    own_outer: OuterState | None,
    consensus: int,
    own_cohort: bool,
) -> tuple[list[torch.Tensor], OuterState | None]:
    """What a peer loads from a served state (split by :func:`split_served`): only what the digest
    covers comes from the server. The rest is the peer's own: its batch-norm statistics (unused in
    training, recalibrated before any evaluation) and, in outer tasks, its anchor and residue where
    the state is its own cohort's (``own_cohort``) after the same outer step (same
    :func:`outer_digest`), else a period that starts here (the loaded parameters as anchor, no residue)."""
    worker = [*served_worker[:consensus], *(t.clone() for t in own_worker[consensus:])]
    if served_outer is None or own_outer is None:
        return worker, None
    if own_cohort and outer_digest(served_outer) == outer_digest(own_outer):
        anchor = [t.clone() for t in own_outer.anchor]
        residue = [t.clone() for t in own_outer.residue]
    else:
        anchor = [t.clone() for t in worker[: len(served_outer.anchor)]]
        residue = [torch.zeros_like(t) for t in served_outer.residue]
    return worker, OuterState(list(served_outer.global_params), list(served_outer.momentum), anchor, residue)
