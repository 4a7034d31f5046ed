"""Training the stereo supernet: the classification recipe's pieces, with a regression loss.

What is reused from :mod:`supernet.training` unchanged: the configuration
(:class:`StereoTrainConfig` extends :class:`~supernet.training.config.TrainConfig`), the schedules
(single-stage sandwich or progressive shrinking, :func:`~supernet.training.schedule.phase_at`), the
sandwich rule per step (:func:`~supernet.training.schedule.step_configs`), channel sorting when a
width phase starts, the optimizer with its warm-up + cosine schedule
(:func:`~supernet.training.optimizer.make_optimizer`,
:func:`~supernet.training.optimizer.optimizer_step`), deterministic data sharding and BN recalibration.

What is stereo-specific, and why it is written here rather than used from there:
:func:`~supernet.training.gradients.accumulate_gradients` and
:func:`~supernet.training.evaluation.evaluate` take one input tensor and class labels, call
``net.logits`` and distil through a softmax; a stereo sub-network takes two images, returns 7
disparity maps and is a regression. So :func:`accumulate_stereo_gradients` keeps
the same contract (zero grads, K sub-networks, gradients summed, no optimizer step, the same returned
statistics for the swarm and the ledger) with the multi-scale loss, and in-place distillation becomes
the per-scale error against the largest sub-network's detached predictions
(:meth:`tasks.stereo.MultiScaleLoss.distillation`): a sub-network's loss is
``student_label_weight × ground-truth loss + distill_weight × distillation``.

CPU speed: with ``channels_last`` (default) the images and weights use the channels-last layout, which
makes the depthwise convolutions' backward pass several times faster on CPU.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, default_collate

from supernet.config import SubnetConfig, derive_seed
from supernet.init import build_initialised
from supernet.stereo.model import StereoSupernet
from supernet.training.config import TrainConfig
from supernet.training.evaluation import evaluation_configs
from supernet.training.gradients import accumulate_sandwich
from supernet.training.optimizer import make_optimizer, optimizer_step
from supernet.training.schedule import maybe_sort_channels, phase_at, step_configs
from tasks import get_task
from tasks.sharding import shard_indices
from tasks.stereo.metrics import DEFAULT_SCALE_WEIGHTS, MultiScaleLoss, StereoMetrics

__all__ = [
    "StereoTrainConfig",
    "build_stereo_supernet",
    "stereo_batch",
    "accumulate_stereo_gradients",
    "evaluate_stereo",
    "evaluate_stereo_subnets",
    "mean_disparity_baseline",
    "train_stereo",
]

log = logging.getLogger(__name__)


@dataclass
class StereoTrainConfig(TrainConfig):
    """:class:`TrainConfig` with stereo defaults and the stereo supernet's own options.

    ``unit_channels`` are the widths of the 6 units, ``stem_channels`` the full-resolution stem;
    ``max_displacement`` the correlation range at 1/8 resolution, ``fine_correlation`` the extra
    correlation at 1/4; ``scale_weights`` / ``loss_kind`` the multi-scale loss; ``activation`` the
    units' activation. ``num_threads`` (0: leave torch's setting) and ``channels_last`` are CPU speed.
    """

    task: str = "stereo-synthetic"
    stem_channels: int = 8
    unit_channels: tuple[int, ...] = (8, 16, 24, 32, 48, 64)
    activations: tuple[str, ...] = ("relu",) * 6
    activation: str = "relu"
    max_displacement: int = 4
    fine_correlation: bool = True
    scale_weights: tuple[float, ...] = DEFAULT_SCALE_WEIGHTS
    loss_kind: str = "smooth_l1"
    total_steps: int = 500
    batch_size: int = 4
    num_subnets: int = 3
    optimizer: str = "adamw"
    lr: float = 5e-3
    weight_decay: float = 1e-4
    warmup_steps: int = 10
    min_lr: float = 1e-5
    grad_clip_norm: float | None = 10.0
    distill_weight: float = 0.5
    student_label_weight: float = 1.0
    bn_calibration_batches: int = 8
    eval_batch_size: int = 16
    eval_random_subnets: int = 2
    channels_last: bool = True
    num_threads: int = 0

    def __post_init__(self) -> None:
        self.scale_weights = tuple(self.scale_weights)
        super().__post_init__()
        if len(self.unit_channels) != 6:
            raise ValueError(f"unit_channels: {self.unit_channels!r} is not 6 unit widths")
        if len(self.scale_weights) != 7:
            raise ValueError(f"scale_weights: {self.scale_weights!r} is not 7 weights (coarse to fine)")
        MultiScaleLoss(self.scale_weights, self.loss_kind)  # validates both


def build_stereo_supernet(cfg: StereoTrainConfig) -> StereoSupernet:
    """The stereo supernet ``cfg`` describes, initial weights drawn from a generator seeded by
    ``cfg.seed`` (:func:`supernet.init.build_initialised`: torch's global generator is neither read
    nor advanced, so builds in concurrent threads give the same weights)."""
    generator = torch.Generator().manual_seed(derive_seed("init", cfg.seed) % (2**63))
    net = build_initialised(
        lambda: StereoSupernet(
            cfg.space(),
            widths=cfg.unit_channels,
            stem_channels=cfg.stem_channels,
            max_displacement=cfg.max_displacement,
            fine_correlation=cfg.fine_correlation,
            activation=cfg.activation,
            channel_divisor=cfg.channel_divisor,
            kernel_transform=cfg.kernel_transform,
        ),
        generator,
    )
    net = net.to(cfg.device)
    if cfg.channels_last:
        net = net.to(memory_format=torch.channels_last)
    return net


def stereo_batch(
    dataset: Dataset, indices: Sequence[int], channels_last: bool = False
) -> dict[str, torch.Tensor]:
    """Load and stack the samples ``indices`` into a batch dict (images channels-last if asked)."""
    batch = default_collate([dataset[int(i)] for i in indices])
    if channels_last:
        for key in ("left", "right"):
            batch[key] = batch[key].contiguous(memory_format=torch.channels_last)
    return batch


def _to(
    batch: Mapping[str, torch.Tensor], device: torch.device, channels_last: bool
) -> dict[str, torch.Tensor]:
    out = {k: v.to(device) for k, v in batch.items()}
    if channels_last:
        for key in ("left", "right"):
            out[key] = out[key].contiguous(memory_format=torch.channels_last)
    return out


def accumulate_stereo_gradients(
    net: StereoSupernet,
    batch: Mapping[str, torch.Tensor],
    configs: Sequence[SubnetConfig],
    cfg: StereoTrainConfig,
    loss: MultiScaleLoss | None = None,
) -> dict[str, Any]:
    """Zero the gradients, then forward/backward each sub-network of ``configs`` on one batch.

    The contract of :func:`supernet.training.gradients.accumulate_gradients`: gradients summed over the
    sub-networks, no optimizer step; with distillation on, the largest sub-network is the teacher
    (reused if ``configs[0]`` is it, else run once without gradients). Returns ``loss`` (mean total
    loss), ``losses``, ``task_losses``, ``distill_losses``, ``config_hashes``, ``samples`` and
    ``train_macs`` (3 × forward per trained pair, plus a teacher-only forward if one was needed).
    """
    if not configs:
        raise ValueError("configs: need at least one sub-network")
    loss = loss or MultiScaleLoss(cfg.scale_weights, cfg.loss_kind)
    device = next(net.parameters()).device
    batch = _to(batch, device, cfg.channels_last)
    left, right, gt, valid = batch["left"], batch["right"], batch["disparity"], batch["valid"]
    return accumulate_sandwich(
        net,
        configs,
        cfg,
        forward=lambda: net(left, right),
        task_loss=lambda predictions: loss(predictions, gt, valid),
        soft_targets=lambda predictions: [p.detach() for p in predictions],
        distill_loss=loss.distillation,
        samples=left.shape[0],
        input_size=tuple(left.shape[-2:]),
    )


@torch.no_grad()
def evaluate_stereo(
    model: nn.Module, dataset: Dataset, batch_size: int = 16, device: str = "cpu", channels_last: bool = False
) -> dict[str, float]:
    """EPE, bad-1/2/3 and D1 of ``model`` (a supernet or an exported sub-network, eval mode) on ``dataset``."""
    was_training = model.training
    model.eval()
    metrics = StereoMetrics()
    # An own generator: a DataLoader draws a (here unused) worker seed, from the global one otherwise.
    for batch in DataLoader(dataset, batch_size=batch_size, generator=torch.Generator()):
        batch = _to(batch, torch.device(device), channels_last)
        metrics.update(model(batch["left"], batch["right"]), batch["disparity"], batch["valid"])
    model.train(was_training)
    return metrics.compute()


def _calibration_batches(dataset: Dataset, cfg: StereoTrainConfig, count: int, salt: int = 0):
    """``count`` training batches in a fixed random order (the same for every sub-network)."""
    generator = torch.Generator().manual_seed(derive_seed("bn-calibration", cfg.seed, salt) % (2**63))
    order = torch.randperm(len(dataset), generator=generator)[: count * cfg.batch_size].tolist()
    for i in range(0, len(order) - cfg.batch_size + 1, cfg.batch_size):
        yield stereo_batch(dataset, order[i : i + cfg.batch_size], cfg.channels_last)


def evaluate_stereo_subnets(
    net: StereoSupernet,
    task,
    cfg: StereoTrainConfig,
    configs: dict[str, SubnetConfig] | None = None,
    *,
    export: bool = False,
) -> list[dict[str, Any]]:
    """Evaluate sub-networks after BN recalibration (default: largest, smallest, a few random).

    Each row: ``name``, ``config``, ``hash``, ``macs`` (per pair at the task's size), ``params``,
    ``epe``, ``bad1``, ``bad2``, ``bad3``, ``d1`` and, with ``export=True``, ``exported_epe`` of the
    standalone model exported after recalibration.
    """
    configs = evaluation_configs(net, cfg) if configs is None else configs
    size = tuple(task.input_size[-2:])
    rows = []
    for name, sub in configs.items():
        batches = _calibration_batches(task.train_set, cfg, cfg.bn_calibration_batches)
        net.recalibrate_bn(sub, batches, cfg.bn_calibration_batches)
        row = {
            "name": name,
            "config": str(sub),
            "hash": sub.hash,
            "macs": net.flops(sub, size),
            "params": net.num_parameters(sub),
            **evaluate_stereo(net, task.val_set, cfg.eval_batch_size, cfg.device, cfg.channels_last),
        }
        if export:
            model = net.export(sub)
            row["exported_epe"] = evaluate_stereo(model, task.val_set, cfg.eval_batch_size, cfg.device)["epe"]
        rows.append(row)
    return rows


@torch.no_grad()
def mean_disparity_baseline(task, batches: int = 32, batch_size: int = 8) -> dict[str, float]:
    """The metrics of always predicting the mean ground-truth disparity of (the first pairs of) the
    training set: the reference the quality benchmark compares with."""
    total, count = 0.0, 0
    for i in range(batches):
        batch = stereo_batch(task.train_set, range(i * batch_size, (i + 1) * batch_size))
        total += batch["disparity"][batch["valid"]].double().sum().item()
        count += int(batch["valid"].sum())
    mean = total / max(count, 1)
    metrics = StereoMetrics()
    for batch in DataLoader(task.val_set, batch_size=16, generator=torch.Generator()):
        metrics.update(torch.full_like(batch["disparity"], mean), batch["disparity"], batch["valid"])
    return {"mean_disparity": mean, **metrics.compute()}


def _format(rows: list[dict[str, Any]]) -> str:
    return ", ".join(f"{r['name']} EPE {r['epe']:.3f}" for r in rows)


def train_stereo(
    cfg: StereoTrainConfig,
    task=None,
    *,
    progress: Callable[[str], None] | None = None,
    participant: str = "local/0",
    max_seconds: float | None = None,
    final_eval: bool = True,
) -> dict[str, Any]:
    """Train the stereo supernet on one process; the loop of :func:`supernet.training.loop.train`.

    ``max_seconds`` stops training early (the schedule is cut, the final evaluation still runs).
    Returns ``net``, ``task``, ``history``, ``evaluations``, ``final`` (rows of
    :func:`evaluate_stereo_subnets`), ``seconds`` (training only), ``steps`` and ``train_macs``.
    """

    say = progress or log.info
    if task is None:
        task = get_task(cfg.task, **cfg.task_options)
    previous_threads = torch.get_num_threads()
    if cfg.num_threads:
        torch.set_num_threads(cfg.num_threads)
    try:
        net = build_stereo_supernet(cfg)
        optimizer = make_optimizer(net, cfg)
        loss = MultiScaleLoss(cfg.scale_weights, cfg.loss_kind)
        history, evaluations, total_macs = [], [], 0
        started = time.perf_counter()
        for step in range(cfg.total_steps):
            if max_seconds is not None and time.perf_counter() - started > max_seconds:
                say(f"time limit {max_seconds:.0f}s reached after {step} of {cfg.total_steps} steps")
                break
            if maybe_sort_channels(net, step, cfg, optimizer):
                say(f"step {step}: sorted channels by importance ({phase_at(step, cfg).name} phase)")
            indices = shard_indices(
                len(task.train_set), cfg.seed, step, [participant], participant, cfg.batch_size
            )
            batch = stereo_batch(task.train_set, indices)
            stats = accumulate_stereo_gradients(net, batch, step_configs(net, step, cfg), cfg, loss)
            if not math.isfinite(stats["loss"]):
                raise FloatingPointError(f"step {step}: loss is {stats['loss']} (lower lr or clip gradients)")
            lr = optimizer_step(net, optimizer, step, cfg)
            total_macs += stats["train_macs"]
            elapsed = time.perf_counter() - started
            history.append({"step": step, "loss": stats["loss"], "lr": lr, "seconds": elapsed})
            if cfg.log_every and (step + 1) % cfg.log_every == 0:
                say(f"step {step + 1}/{cfg.total_steps} loss {stats['loss']:.4f} lr {lr:.5f} {elapsed:.0f}s")
            if cfg.eval_every and (step + 1) % cfg.eval_every == 0 and step + 1 < cfg.total_steps:
                rows = evaluate_stereo_subnets(net, task, cfg)
                evaluations.append((step + 1, rows))
                say(f"step {step + 1}: {_format(rows)}")
        seconds = time.perf_counter() - started
        final = evaluate_stereo_subnets(net, task, cfg) if final_eval else []
    finally:
        torch.set_num_threads(previous_threads)
    if final:
        say(f"final after {seconds:.0f}s ({len(history)} steps): {_format(final)}")
    return {
        "net": net,
        "task": task,
        "history": history,
        "evaluations": evaluations,
        "final": final,
        "seconds": seconds,
        "steps": len(history),
        "train_macs": total_macs,
    }
