"""What a peer's agent and its workers say to each other, and the memory they share.

Every request the agent sends over a worker's pipe is one of the frozen dataclasses below and gets
exactly one reply, also a dataclass (or :class:`WorkerFailed`). Only :class:`peer.worker_pool.WorkerPool`
sends requests and only :mod:`peer.worker` answers them, so this module is the whole protocol.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# ------------------------------------------------------------------ requests (agent -> worker)


@dataclass(frozen=True)
class Compute:
    """Train on the round's sample stream until the shared stop flag rises, then reduce in the host."""

    round_index: int
    mode: str  # "data": every cohort trains the same sub-networks; "model": each cohort its share
    cohort_rank: int
    num_cohorts: int
    # tasks on an operator's dataset: the training shards (manifest indices) the streams draw from
    data_shards: tuple[int, ...] = ()


@dataclass(frozen=True)
class Apply:
    """The shared gradient buffer holds the swarm's average (if ``committed``): take the step."""

    round_index: int
    committed: bool


@dataclass(frozen=True)
class Load:
    """Replace model and optimizer state by the shared state buffer (a downloaded state)."""


@dataclass(frozen=True)
class Stop:
    """Leave the host's process group and exit."""


# ------------------------------------------------------------------ replies (worker -> agent)


@dataclass(frozen=True)
class HostContribution:
    """What this host's workers computed in one round, summed over the workers (the gradient
    numerator itself lies in :attr:`SharedBuffers.grads`)."""

    samples: int
    loss: float  # mean loss over the host's samples
    train_macs: int  # multiply-adds of the forward passes, for the receipt's FLOPs figure
    config_hashes: tuple[str, ...]  # the sub-networks trained, in training order
    scale: float  # what the round's per-cohort result is multiplied by (model-parallel rounds)
    worker_seconds: float  # rank 0's time in its mini-batches
    data_shards: tuple[int, ...] = ()  # the shards the streams drew from (Compute.data_shards)


@dataclass(frozen=True)
class Applied:
    lr: float | None  # the learning rate of the step taken (None: no step, the round aborted)


@dataclass(frozen=True)
class Loaded:
    pass


@dataclass(frozen=True)
class WorkerFailed:
    message: str


# ------------------------------------------------------------------ shared memory


@dataclass
class SharedBuffers:
    """The memory the agent and its workers share (all CPU tensors in shared memory).

    ``grads`` changes meaning within a round, always at the same two points: after :class:`Compute`
    it holds the host's gradient numerator (sum over the host's samples of the per-sample gradient),
    and the agent overwrites it with the swarm's average before it sends :class:`Apply`.
    """

    grads: list[torch.Tensor]
    state: list[torch.Tensor]  # the model state (supernet.state layout) after the last applied round
    stop: torch.Tensor  # int64 [1]: the agent sets it to 1 to close the round's computation
    progress: torch.Tensor  # float64 [world, 3]: samples, loss sum, multiply-adds so far this round

    @classmethod
    def create(cls, grads_like: list[torch.Tensor], state: list[torch.Tensor], world: int) -> SharedBuffers:
        return cls(
            # Contiguous whatever the model's memory format (the stereo supernet is channels-last):
            # hivemind flattens tensors with .view(-1), which only works on contiguous ones.
            [torch.zeros(g.shape, dtype=g.dtype).share_memory_() for g in grads_like],
            [t.detach().cpu().contiguous().clone().share_memory_() for t in state],
            torch.zeros(1, dtype=torch.int64).share_memory_(),
            torch.zeros(world, 3, dtype=torch.float64).share_memory_(),
        )
