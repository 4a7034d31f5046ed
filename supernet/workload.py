"""One interface over both supernet families, for code that must not care which one it trains.

The swarm's workers, the aggregator's checkpoints and the search all need the same few operations —
build the supernet a task needs, load a batch, accumulate one sandwich step's gradients, evaluate the
largest and smallest sub-networks — and each family implements them with its own functions
(:mod:`supernet.training` for classification, :mod:`supernet.stereo_training` for stereo). A
:class:`Workload` binds a task to its training configuration and dispatches to them, so callers hold
one object and no ``if stereo`` branches.

The configuration comes from a plain dict of :class:`~supernet.training.config.TrainConfig` (or
:class:`~supernet.stereo_training.StereoTrainConfig`) fields, which is what travels in task
specifications and checkpoints.

Randomness: every operation that draws (initialisation, augmentation, dropout) takes its draws from
an explicit ``torch.Generator`` — seeded from the configuration in :meth:`Workload.build` and BN
recalibration, given by the caller to :meth:`Workload.batch` and :meth:`Workload.accumulate` — never
from torch's global generator, which every thread shares: so a workload may be used from several
threads at once (an audit replaying a peer's gradient while a checkpoint is built) without a lock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from supernet.config import SubnetConfig
from supernet.training.batches import training_batch
from supernet.training.config import TrainConfig
from supernet.training.evaluation import evaluate_subnets
from supernet.training.gradients import accumulate_gradients
from supernet.training.optimizer import make_optimizer
from tasks import get_task

__all__ = ["Workload", "family_of", "swarm_train_options", "train_config", "workload_for"]


def family_of(task_name: str) -> str:
    """``"stereo"`` for stereo tasks, ``"classification"`` for the rest."""
    return "stereo" if task_name.startswith("stereo") else "classification"


@dataclass
class Workload:
    """A task, its training configuration and the family's functions (see the module docstring)."""

    family: str
    cfg: TrainConfig
    task: Any  # tasks.registry.Task

    @property
    def metric_name(self) -> str:
        return self.task.metric_name

    @property
    def higher_is_better(self) -> bool:
        return bool(self.task.higher_is_better)

    @property
    def input_size(self) -> tuple[int, ...]:
        """What ``net.flops(cfg, input_size)`` expects: (C, H, W) for images, (H, W) for stereo pairs."""
        size = tuple(self.task.input_size)
        return size[-2:] if self.family == "stereo" else size

    def build(self) -> nn.Module:
        """The supernet with its initial weights, drawn from a generator seeded by the config's seed
        (the same in every thread and process; see :mod:`supernet.init`)."""
        if self.family == "stereo":
            from supernet.stereo_training import build_stereo_supernet

            return build_stereo_supernet(self.cfg)
        from supernet.training.build import build_supernet

        return build_supernet(self.cfg, self.task.num_classes, self.task.input_size[0])

    def make_optimizer(self, net: nn.Module) -> torch.optim.Optimizer:

        return make_optimizer(net, self.cfg)

    def batch(self, indices: Sequence[int], generator: torch.Generator) -> Any:
        """Training samples ``indices`` as one batch (what :meth:`accumulate` takes), with the task's
        random augmentation drawn from ``generator`` (stereo tasks have none)."""
        if self.family == "stereo":
            from supernet.stereo_training import stereo_batch

            return stereo_batch(self.task.train_set, indices, self.cfg.channels_last)

        return training_batch(self.task, indices, generator)

    def accumulate(
        self,
        net: nn.Module,
        batch: Any,
        configs: Sequence[SubnetConfig],
        device: torch.device,
        generator: torch.Generator,
    ) -> dict[str, Any]:
        """Zero the gradients and sum the gradients of ``configs`` on ``batch`` (no optimizer step);
        the statistics of :func:`supernet.training.gradients.accumulate_sandwich` (``loss``,
        ``samples``, ...).
        Dropout masks, if any, are drawn from ``generator`` (the stereo supernet has no dropout)."""
        if self.family == "stereo":
            from supernet.stereo_training import accumulate_stereo_gradients

            return accumulate_stereo_gradients(net, batch, configs, self.cfg)

        inputs, targets = batch
        return accumulate_gradients(
            net, inputs.to(device), targets.to(device), configs, self.cfg, generator=generator
        )

    def evaluate(
        self, net: nn.Module, configs: dict[str, SubnetConfig] | None = None
    ) -> list[dict[str, Any]]:
        """Rows per sub-network after BN recalibration (default: largest, smallest, a few random); each
        row has ``name``, ``config``, ``macs``, ``params`` and the task metric under :attr:`metric_name`."""
        if self.family == "stereo":
            from supernet.stereo_training import evaluate_stereo_subnets

            return evaluate_stereo_subnets(net, self.task, self.cfg, configs)

        return evaluate_subnets(net, self.task, self.cfg, configs)


def workload_for(task_name: str, train_options: dict[str, Any] | None = None, *, task=None) -> Workload:
    """The workload of built-in task ``task_name`` with ``train_options`` (config fields) applied.

    Raises ``ValueError`` with a one-line message for an unknown option or a bad value.
    """

    cfg = train_config(task_name, train_options)
    if task is None:
        task = get_task(task_name, **cfg.task_options)
    return Workload(family_of(task_name), cfg, task)


def train_config(task_name: str, train_options: dict[str, Any] | None = None) -> TrainConfig:
    """The family's config class built from ``train_options``; ``ValueError`` (one line) if unusable."""
    if family_of(task_name) == "stereo":
        from supernet.stereo_training import StereoTrainConfig

        return StereoTrainConfig.from_dict({**(train_options or {}), "task": task_name})
    return TrainConfig.from_dict({**(train_options or {}), "task": task_name})


def swarm_train_options(spec) -> dict[str, Any]:
    """The TrainConfig fields every peer of a swarm task uses, all derived from the signed
    :class:`protocol.task_spec.TaskSpec` ``spec``: the same spec gives every peer the same supernet,
    sub-network sampling, schedule and optimizer."""
    p = spec.params
    options = dict(
        seed=spec.seed,
        batch_size=p.batch_size,
        num_subnets=p.subnets_per_step,
        lr=float(p.learning_rate),
        total_steps=p.total_rounds,
        warmup_steps=p.warmup_rounds,
        schedule=p.schedule,
    )
    if family_of(spec.task) == "classification":  # the stereo supernet has its own widths
        options.update(width_mult=float(p.width_mult), head_channels=p.head_channels)
    return options
