"""The schedule: which phase a step belongs to, and which sub-networks it (or one cohort) trains.

Every function here is a pure function of the configuration and the step (channel sorting: of the
parameters too), so every peer derives the same answer without talking to the others.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from supernet.classification import ClassificationSupernet
from supernet.config import SearchSpace, SubnetConfig, sandwich_configs
from supernet.training.config import TrainConfig

__all__ = [
    "PHASE_NAMES",
    "Phase",
    "phases",
    "phase_at",
    "space_for_phase",
    "step_configs",
    "cohort_configs",
    "maybe_sort_channels",
]

PHASE_NAMES = ("full", "kernel", "depth", "width")


@dataclass(frozen=True)
class Phase:
    """One stage of the schedule: steps ``[start, end)`` sample from the given choices.

    ``sort_channels`` — sort middle channels when the stage starts, keeping the bands given by
    ``protected_expand_ratios`` (see :meth:`supernet.elastic.blocks.ElasticMBConv.sort_channels`).
    """

    name: str
    stage: int
    start: int
    end: int
    kernel_sizes: tuple[int, ...]
    expand_ratios: tuple[float, ...]
    depths: tuple[int, ...]
    num_subnets: int
    sort_channels: bool = False
    protected_expand_ratios: tuple[float, ...] = ()


def phases(cfg: TrainConfig) -> list[Phase]:
    """The whole schedule as a list of stages covering ``range(cfg.total_steps)`` (empty ones dropped)."""
    space = cfg.space()
    K, E, D = space.kernel_sizes, space.expand_ratios, space.depths
    if cfg.schedule == "sandwich":
        return [Phase("sandwich", 0, 0, cfg.total_steps, K, E, D, cfg.num_subnets)]
    # progressive shrinking: (name, kernels, expands, depths, K, sort, protected)
    stages: dict[str, list[tuple]] = {
        "full": [((K[-1],), (E[-1],), (D[-1],), 1, False, ())],
        "kernel": [(K, (E[-1],), (D[-1],), cfg.num_subnets, False, ())],
        "depth": [(K, (E[-1],), D[-1 - i :], cfg.num_subnets, False, ()) for i in range(1, len(D))],
        "width": [(K, E[-1 - i :], D, cfg.num_subnets, True, E[-i:-1]) for i in range(1, len(E))],
    }
    shares = dict(zip(PHASE_NAMES, cfg.phase_fractions, strict=True))
    active = [name for name in PHASE_NAMES if stages[name] and shares[name] > 0]
    total_share = sum(shares[name] for name in active)
    out: list[Phase] = []
    cumulative, start = 0.0, 0
    for name in active:
        per_stage = shares[name] / total_share / len(stages[name])
        for i, (ks, es, ds, k, sort, protected) in enumerate(stages[name]):
            cumulative += per_stage
            end = (
                cfg.total_steps
                if (name, i) == (active[-1], len(stages[name]) - 1)
                else round(cumulative * cfg.total_steps)
            )
            if end > start:
                out.append(Phase(name, i, start, end, ks, es, ds, k, sort, protected))
            start = max(start, end)
    return out


def phase_at(step: int, cfg: TrainConfig) -> Phase:
    """The stage that ``step`` (or swarm round) belongs to; steps past the end stay in the last stage.
    ``ValueError`` for a negative step."""
    if step < 0:
        raise ValueError(f"step: {step} is negative")
    schedule = phases(cfg)
    for phase in schedule:
        if step < phase.end:
            return phase
    return schedule[-1]


def space_for_phase(phase: Phase, space: SearchSpace) -> SearchSpace:
    """The sub-space of ``space`` that ``phase`` samples from."""
    return space.restrict(phase.kernel_sizes, phase.expand_ratios, phase.depths)


def step_configs(
    net: ClassificationSupernet, step: int, cfg: TrainConfig, salt: str = ""
) -> list[SubnetConfig]:
    """The sub-networks of ``step`` by the sandwich rule within its phase's space (largest first)."""
    phase = phase_at(step, cfg)
    space = space_for_phase(phase, net.space)
    return sandwich_configs(net, cfg.seed, step, phase.num_subnets, salt, space=space)


def cohort_configs(
    net: ClassificationSupernet, step: int, cfg: TrainConfig, cohort_rank: int, num_cohorts: int
) -> tuple[list[SubnetConfig], float]:
    """Model-parallel rounds: the sub-networks cohort ``cohort_rank`` of ``num_cohorts`` trains at
    ``step``, and the factor its gradient mean is scaled by.

    The round's sandwich list (largest, smallest, random; ``max(K, num_cohorts)`` entries, K the
    phase's sub-networks per step) is dealt out to the cohorts like cards: cohort ``j`` trains entries
    ``j, j + C, j + 2C, ...``. Every entry is trained by exactly one cohort, so the round's update —
    the sum over cohorts of each cohort's mean gradient — is the sandwich-rule gradient of the whole
    list, as one process would compute it, but each cohort only runs its share. When there are more
    cohorts than K, the list is longer than K and the sum is scaled by ``K / len(list)`` so the update
    keeps the size of K sub-networks' gradients. With one cohort this is :func:`step_configs`.
    ``ValueError`` unless ``0 <= cohort_rank < num_cohorts``.
    """
    if not 0 <= cohort_rank < num_cohorts:
        raise ValueError(f"cohort_rank: {cohort_rank} is not in [0, {num_cohorts})")
    phase = phase_at(step, cfg)
    space = space_for_phase(phase, net.space)
    length = max(phase.num_subnets, num_cohorts)
    configs = sandwich_configs(net, cfg.seed, step, length, "", space=space)
    return configs[cohort_rank::num_cohorts], phase.num_subnets / length


def maybe_sort_channels(
    net: ClassificationSupernet, step: int, cfg: TrainConfig, optimizer: torch.optim.Optimizer | None = None
) -> bool:
    """Sort channels if ``step`` is the first step of a width stage; returns whether it sorted.

    Deterministic (a function of the parameters only), so every peer that calls it at the same step
    with the same parameters ends with the same parameters (and optimizer state).
    """
    phase = phase_at(step, cfg)
    if not (phase.sort_channels and step == phase.start):
        return False
    net.sort_channels(phase.protected_expand_ratios, optimizer)
    return True
