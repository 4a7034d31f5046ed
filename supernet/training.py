"""The supernet training recipe, in pieces the swarm can reuse, and one single-process loop.

One step (:func:`train` shows them in order)::

    phase   = phase_at(step, cfg)                      # progressive shrinking or single-stage sandwich
    maybe_sort_channels(net, step, cfg, optimizer)     # when a width phase starts (deterministic)
    configs = step_configs(net, step, cfg)             # sandwich rule, from (seed, step) only
    stats   = accumulate_gradients(net, x, y, configs, cfg)   # K sub-networks, grads summed, NO step
    ...                                                # (the swarm averages gradients here)
    optimizer_step(net, optimizer, step, cfg)          # lr_at(step), optional clipping, step

**Schedules** (``TrainConfig.schedule``):

* ``"sandwich"`` — single-stage (BigNAS-style): every step trains the largest, the smallest and
  ``K - 2`` random sub-networks of the whole space, with in-place distillation from the largest.
* ``"progressive"`` — once-for-all progressive shrinking: ``full`` (the largest network only), then
  ``kernel`` (elastic kernel), then ``depth`` (depths added from the deepest down, one stage per
  extra depth), then ``width`` (expand ratios added from the widest down, one stage per ratio).
  ``phase_fractions`` gives each phase's share of ``total_steps`` (split evenly among its stages).
  When a width stage starts, every block's middle channels are sorted by importance (L1 norm of the
  projection weights), within bands that keep the widths of earlier stages nested. Every stage after
  ``full`` samples by the sandwich rule inside the phase's space.

**Loss**: the largest sub-network is trained on the labels; every other sub-network on
``student_label_weight × task loss + distill_weight × KD``, where KD is the cross-entropy against the
largest sub-network's detached soft predictions on the same batch (in-place distillation; temperature
``distill_temperature``). Gradients of the K sub-networks are summed (the learning rate is not divided
by K, as in once-for-all). **Optimizer**: SGD (Nesterov momentum) or AdamW, no weight decay on
batch-norm parameters, biases and kernel-transformation matrices; a linear warm-up then cosine decay
over ``total_steps``. **Evaluation**: largest, smallest and a few random sub-networks, each after BN
recalibration on training batches.

Determinism: sub-networks come from :func:`supernet.config.sandwich_configs` (hash of the seed and the
step); data from :func:`tasks.sharding.shard_indices`; initial weights, augmentation and dropout from
explicit ``torch.Generator`` objects seeded from ``cfg.seed`` (:mod:`supernet.init`,
:func:`training_batch`, the ``generator`` of :func:`accumulate_gradients`). Torch's global generator
is never seeded nor relied on: threads share it, and a computation that must be replayed exactly (a
spot audit in one thread of the aggregator) cannot depend on what other threads draw from it.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, default_collate

from supernet.bn import recalibrate_bn
from supernet.classification import DEFAULT_ACTIVATIONS, DEFAULT_UNIT_CHANNELS, ClassificationSupernet
from supernet.config import SearchSpace, SubnetConfig, derive_seed, sandwich_configs
from supernet.flops import training_flops_per_sample
from supernet.init import build_initialised
from tasks import get_task
from tasks.sharding import shard_indices

__all__ = [
    "TrainConfig",
    "Phase",
    "phases",
    "phase_at",
    "space_for_phase",
    "step_configs",
    "maybe_sort_channels",
    "build_supernet",
    "make_optimizer",
    "lr_at",
    "accumulate_gradients",
    "accumulate_sandwich",
    "optimizer_step",
    "batch_for_step",
    "training_batch",
    "calibration_loader",
    "recalibrate_for_evaluation",
    "evaluate",
    "evaluate_subnets",
    "train",
]

log = logging.getLogger(__name__)

SCHEDULES = ("sandwich", "progressive")
OPTIMIZERS = ("sgd", "adamw")
PHASE_NAMES = ("full", "kernel", "depth", "width")


@dataclass
class TrainConfig:
    """Every hyper-parameter of a supernet training run, in one place (JSON-able via ``to_dict``)."""

    # task and seed
    task: str = "digits"
    task_options: dict[str, Any] = field(default_factory=dict)
    seed: int = 0
    # supernet
    kernel_sizes: tuple[int, ...] = (3, 5, 7)
    expand_ratios: tuple[float, ...] = (3, 4, 6)
    depths: tuple[int, ...] = (2, 3, 4)
    width_mult: float = 1.0
    stem_channels: int = 16
    unit_channels: tuple[int, ...] = DEFAULT_UNIT_CHANNELS
    head_channels: int = 640
    channel_divisor: int = 8
    activations: tuple[str, ...] = DEFAULT_ACTIVATIONS
    stem_stride: int = 1
    dropout: float = 0.0  # mask drawn from the generator given to accumulate_gradients
    kernel_transform: bool = True
    # schedule
    total_steps: int = 1000
    batch_size: int = 64
    num_subnets: int = 4  # K: sub-networks per step (sandwich: largest, smallest, K-2 random)
    schedule: str = "sandwich"  # "sandwich" | "progressive"
    phase_fractions: tuple[float, float, float, float] = (0.1, 0.2, 0.35, 0.35)  # full, kernel, depth, width
    # loss
    label_smoothing: float = 0.0
    distill: bool = True
    distill_weight: float = 1.0
    distill_temperature: float = 1.0
    student_label_weight: float = 1.0
    # optimizer
    optimizer: str = "sgd"  # "sgd" | "adamw"
    lr: float = 0.1
    momentum: float = 0.9
    nesterov: bool = True
    betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = 5e-5
    warmup_steps: int = 0
    min_lr: float = 0.0
    grad_clip_norm: float | None = None
    # evaluation
    bn_calibration_batches: int = 16
    eval_random_subnets: int = 3
    eval_batch_size: int = 256
    eval_every: int = 0  # steps between evaluations during training (0: only at the end)
    log_every: int = 10
    device: str = "cpu"

    def __post_init__(self) -> None:
        for name in (
            "kernel_sizes",
            "expand_ratios",
            "depths",
            "unit_channels",
            "activations",
            "phase_fractions",
            "betas",
        ):
            setattr(self, name, tuple(getattr(self, name)))
        checks = [
            ("schedule", self.schedule in SCHEDULES, f"one of {SCHEDULES}"),
            ("optimizer", self.optimizer in OPTIMIZERS, f"one of {OPTIMIZERS}"),
            ("total_steps", self.total_steps >= 1, "at least 1"),
            ("batch_size", self.batch_size >= 2, "at least 2 (batch norm)"),
            ("num_subnets", self.num_subnets >= 1, "at least 1"),
            ("lr", self.lr > 0, "positive"),
            ("weight_decay", self.weight_decay >= 0, "non-negative"),
            ("warmup_steps", 0 <= self.warmup_steps < self.total_steps, "in [0, total_steps)"),
            ("min_lr", 0 <= self.min_lr <= self.lr, "in [0, lr]"),
            ("distill_weight", self.distill_weight >= 0, "non-negative"),
            ("distill_temperature", self.distill_temperature > 0, "positive"),
            ("bn_calibration_batches", self.bn_calibration_batches >= 1, "at least 1"),
            ("phase_fractions", len(self.phase_fractions) == 4 and min(self.phase_fractions) >= 0
             and sum(self.phase_fractions) > 0, "four non-negative shares (full, kernel, depth, width)"),
        ]  # fmt: skip
        for name, ok, expected in checks:
            if not ok:
                raise ValueError(f"{name}: {getattr(self, name)!r} is not {expected}")
        self.space()  # validates the choices

    def space(self) -> SearchSpace:
        return SearchSpace(self.kernel_sizes, self.expand_ratios, self.depths, len(self.unit_channels))

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in data.items()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        known = {f.name for f in fields(cls)}
        for key in data:
            if key not in known:
                raise ValueError(f"{key}: unknown training option")
        return cls(**data)


# --------------------------------------------------------------------------------------------------
# Phases
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Phase:
    """One stage of the schedule: steps ``[start, end)`` sample from the given choices.

    ``sort_channels`` — sort middle channels when the stage starts, keeping the bands given by
    ``protected_expand_ratios`` (see :meth:`ElasticMBConv.sort_channels`).
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
    """The stage that ``step`` (or swarm round) belongs to; steps past the end stay in the last stage."""
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


# --------------------------------------------------------------------------------------------------
# Model, optimizer, schedule
# --------------------------------------------------------------------------------------------------


def build_supernet(cfg: TrainConfig, num_classes: int, in_channels: int) -> ClassificationSupernet:
    """The supernet ``cfg`` describes, with initial weights drawn from a generator seeded by
    ``cfg.seed`` (:func:`supernet.init.build_initialised`: torch's global generator is neither read
    nor advanced, so builds in concurrent threads give the same weights)."""
    generator = torch.Generator().manual_seed(derive_seed("init", cfg.seed) % (2**63))
    net = build_initialised(
        lambda: ClassificationSupernet(
            num_classes,
            in_channels,
            cfg.space(),
            width_mult=cfg.width_mult,
            stem_channels=cfg.stem_channels,
            unit_channels=cfg.unit_channels,
            head_channels=cfg.head_channels,
            channel_divisor=cfg.channel_divisor,
            activations=cfg.activations,
            stem_stride=cfg.stem_stride,
            dropout=cfg.dropout,
            kernel_transform=cfg.kernel_transform,
        ),
        generator,
    )
    return net.to(cfg.device)


def _no_decay(name: str, param: nn.Parameter) -> bool:
    return param.ndim <= 1 or "kernel_transforms" in name


def make_optimizer(net: nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    """SGD (momentum, Nesterov) or AdamW; weight decay only on conv/linear weights."""
    decay = [p for n, p in net.named_parameters() if not _no_decay(n, p)]
    no_decay = [p for n, p in net.named_parameters() if _no_decay(n, p)]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(
            groups, lr=cfg.lr, momentum=cfg.momentum, nesterov=cfg.nesterov and cfg.momentum > 0
        )
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas)


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up to ``lr`` over ``warmup_steps``, then cosine decay to ``min_lr`` at ``total_steps``."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    span = max(1, cfg.total_steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    return cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1.0 + math.cos(math.pi * progress))


def optimizer_step(net: nn.Module, optimizer: torch.optim.Optimizer, step: int, cfg: TrainConfig) -> float:
    """Set the learning rate for ``step``, clip (if configured) and step; returns the learning rate."""
    lr = lr_at(step, cfg)
    for group in optimizer.param_groups:
        group["lr"] = lr
    if cfg.grad_clip_norm is not None:
        nn.utils.clip_grad_norm_(net.parameters(), cfg.grad_clip_norm)
    optimizer.step()
    return lr


# --------------------------------------------------------------------------------------------------
# Gradients
# --------------------------------------------------------------------------------------------------


def _zero_grads(net: nn.Module) -> None:
    """Zero every gradient, materialising missing ones, so all parameters have a gradient tensor."""
    for p in net.parameters():
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        else:
            p.grad.detach_()
            p.grad.zero_()


def distillation_loss(
    student_logits: torch.Tensor, teacher_probs: torch.Tensor, temperature: float
) -> torch.Tensor:
    """Cross-entropy of the student against soft targets (scaled by T² so gradients keep their size)."""
    log_probs = F.log_softmax(student_logits / temperature, dim=1)
    return -(teacher_probs * log_probs).sum(dim=1).mean() * temperature**2


def sandwich_flops_per_sample(
    net: nn.Module, configs: Sequence[SubnetConfig], cfg: TrainConfig, input_size: Sequence[int]
) -> int:
    """The multiply-adds one sample costs in :func:`accumulate_sandwich` with ``configs``: a training
    pass (forward and backward) per sub-network, plus the teacher's forward when distillation needs it
    and the list does not start with it. A function of the configs alone, so the aggregator prices a
    receipt from the sub-networks it derives (:mod:`aggregator.work_pricing`), never from its claim."""
    flops = sum(training_flops_per_sample(net, sub, input_size) for sub in configs)
    teacher_cfg = net.largest_config()
    if cfg.distill and configs and configs[0] != teacher_cfg:
        flops += net.flops(teacher_cfg, input_size)
    return int(flops)


def accumulate_sandwich(
    net: nn.Module,
    configs: Sequence[SubnetConfig],
    cfg: TrainConfig,
    *,
    forward: Callable[[], Any],
    task_loss: Callable[[Any], torch.Tensor],
    soft_targets: Callable[[Any], Any],
    distill_loss: Callable[[Any, Any], torch.Tensor],
    samples: int,
    input_size: Sequence[int],
) -> dict[str, Any]:
    """The model-agnostic core of :func:`accumulate_gradients` (also for other supernets).

    ``net`` needs ``set_active``, ``largest_config`` and ``flops(cfg, input_size)``. ``forward()``
    runs the active sub-network on the batch; ``task_loss(outputs)`` is its loss on the labels;
    ``soft_targets(outputs)`` turns the teacher's outputs into detached distillation targets;
    ``distill_loss(outputs, targets)`` is a student's distillation loss. Zeroes the gradients (every
    parameter gets a gradient tensor), sums the gradients of ``configs``, takes no optimizer step.
    """
    if not configs:
        raise ValueError("configs: need at least one sub-network")
    net.train()
    _zero_grads(net)
    device = next(net.parameters()).device
    teacher_cfg = net.largest_config()
    teacher = None
    macs = sandwich_flops_per_sample(net, configs, cfg, input_size) * samples
    if cfg.distill and configs[0] != teacher_cfg:
        with torch.no_grad():
            net.set_active(teacher_cfg)
            teacher = soft_targets(forward())
    losses, task_losses, distill_losses = [], [], []
    for sub in configs:
        net.set_active(sub)
        outputs = forward()
        label_loss = task_loss(outputs)
        if sub == teacher_cfg or not cfg.distill:
            loss, kd = label_loss, torch.zeros((), device=device)
            if cfg.distill and teacher is None:
                with torch.no_grad():
                    teacher = soft_targets(outputs)
        else:
            kd = distill_loss(outputs, teacher)
            loss = cfg.student_label_weight * label_loss + cfg.distill_weight * kd
        loss.backward()
        losses.append(loss.item())
        task_losses.append(label_loss.item())
        distill_losses.append(kd.item())
    return {
        "loss": sum(losses) / len(losses),
        "losses": losses,
        "task_losses": task_losses,
        "distill_losses": distill_losses,
        "config_hashes": [c.hash for c in configs],
        "samples": samples,
        "train_macs": int(macs),
    }


def accumulate_gradients(
    net: ClassificationSupernet,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    configs: Sequence[SubnetConfig],
    cfg: TrainConfig,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    *,
    generator: torch.Generator | None = None,
) -> dict[str, Any]:
    """Zero the gradients, then forward/backward each sub-network of ``configs`` on one batch.

    Gradients are summed over the sub-networks; no optimizer step is taken. With distillation on, the
    teacher is the largest sub-network: if ``configs[0]`` is it (the sandwich rule puts it first), its
    detached predictions are reused; otherwise it is run once without gradients. ``loss_fn`` defaults
    to cross-entropy with ``cfg.label_smoothing``. Dropout masks (``cfg.dropout > 0``, which then
    needs it) are drawn from ``generator``, the computation's own: never torch's global one.

    Returns ``loss`` (mean total loss over the sub-networks), per-sub-network ``losses``,
    ``task_losses`` and ``distill_losses``, ``config_hashes``, ``samples`` (batch size) and
    ``train_macs`` — the multiply-adds this call spent (``3 × forward`` per trained sample, plus a
    teacher-only forward if one was needed), which is what the ledger credits.
    """
    if cfg.dropout > 0 and generator is None:
        raise ValueError(f"generator: dropout {cfg.dropout} draws its masks from an explicit generator")
    device = next(net.parameters()).device
    inputs, targets = inputs.to(device), targets.to(device)
    if loss_fn is None:

        def loss_fn(logits, y):
            return F.cross_entropy(logits, y, label_smoothing=cfg.label_smoothing)

    T = cfg.distill_temperature
    return accumulate_sandwich(
        net,
        configs,
        cfg,
        forward=lambda: net.logits(inputs, generator),
        task_loss=lambda logits: loss_fn(logits, targets),
        soft_targets=lambda logits: F.softmax(logits.detach() / T, dim=1),
        distill_loss=lambda logits, probs: distillation_loss(logits, probs, T),
        samples=inputs.shape[0],
        input_size=tuple(inputs.shape[1:]),
    )


# --------------------------------------------------------------------------------------------------
# Data and evaluation
# --------------------------------------------------------------------------------------------------


def batch_for_step(dataset: Dataset, indices: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Load and collate the samples ``indices`` (e.g. from :func:`tasks.sharding.shard_indices`)."""
    inputs, targets = default_collate([dataset[int(i)] for i in indices])
    return inputs, targets


def training_batch(
    task, indices: Sequence[int], generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """The training samples ``indices`` of ``task``, collated and augmented (``task.augmentation``,
    if any) with draws from ``generator``: the same generator state gives the same batch, whatever
    other threads draw meanwhile."""
    inputs, targets = batch_for_step(task.train_set, indices)
    if task.augmentation is not None:
        inputs = task.augmentation(inputs, generator)
    return inputs, targets


def calibration_loader(dataset: Dataset, cfg: TrainConfig, seed: int = 0) -> DataLoader:
    """Shuffled training batches for BN recalibration, in a fixed order (seeded generator)."""
    generator = torch.Generator().manual_seed(derive_seed("bn-calibration", cfg.seed, seed) % (2**63))
    return DataLoader(dataset, batch_size=cfg.batch_size, shuffle=True, drop_last=True, generator=generator)


def recalibrate_for_evaluation(
    net: ClassificationSupernet, sub: SubnetConfig, task, cfg: TrainConfig
) -> None:
    """BN recalibration of ``sub`` on ``cfg.bn_calibration_batches`` training batches, reproducibly.

    The batches' order and their augmentation are drawn from generators seeded by ``cfg.seed``, the
    same for every sub-network, so evaluating the same parameters twice gives the same statistics in
    any thread; torch's global generator is not used.
    """
    generator = torch.Generator().manual_seed(derive_seed("bn-augmentation", cfg.seed) % (2**63))
    batches = calibration_loader(task.train_set, cfg)
    if task.augmentation is not None:
        batches = ((task.augmentation(x, generator), y) for x, y in batches)
    recalibrate_bn(net, sub, batches, cfg.bn_calibration_batches)


@torch.no_grad()
def evaluate(
    model: nn.Module, dataset: Dataset, metric: Callable, batch_size: int = 256, device: str = "cpu"
) -> float:
    """The dataset-level metric of ``model`` (eval mode): a sample-weighted mean of per-batch metrics."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    # An own generator: a DataLoader draws a (here unused) worker seed, from the global one otherwise.
    for inputs, targets in DataLoader(dataset, batch_size=batch_size, generator=torch.Generator()):
        outputs = model(inputs.to(device))
        total += metric(outputs, targets.to(device)) * len(targets)
        count += len(targets)
    model.train(was_training)
    return total / max(count, 1)


def evaluation_configs(
    net: ClassificationSupernet, cfg: TrainConfig, num_random: int | None = None
) -> dict[str, SubnetConfig]:
    """The sub-networks evaluated: ``largest``, ``smallest`` and ``random-i`` (fixed by the seed)."""
    num_random = cfg.eval_random_subnets if num_random is None else num_random
    out = {"largest": net.largest_config(), "smallest": net.smallest_config()}
    for i in range(num_random):
        out[f"random-{i + 1}"] = net.sample_config(derive_seed("eval", cfg.seed, i))
    return out


def evaluate_subnets(
    net: ClassificationSupernet,
    task,
    cfg: TrainConfig,
    configs: dict[str, SubnetConfig] | None = None,
    *,
    export: bool = False,
) -> list[dict[str, Any]]:
    """Evaluate sub-networks after BN recalibration (default: largest, smallest, a few random).

    Each row: ``name``, ``config`` (str), ``hash``, ``macs``, ``params``, the task metric (key
    ``task.metric_name``) and, with ``export=True``, ``exported_<metric>`` measured on the
    standalone model exported after recalibration.
    """
    configs = evaluation_configs(net, cfg) if configs is None else configs
    input_size = task.input_size
    rows = []
    for name, sub in configs.items():
        recalibrate_for_evaluation(net, sub, task, cfg)
        row = {
            "name": name,
            "config": str(sub),
            "hash": sub.hash,
            "macs": net.flops(sub, input_size),
            "params": net.num_parameters(sub),
            task.metric_name: evaluate(net, task.val_set, task.metric, cfg.eval_batch_size, cfg.device),
        }
        if export:
            model = net.export(sub)
            row[f"exported_{task.metric_name}"] = evaluate(
                model, task.val_set, task.metric, cfg.eval_batch_size, cfg.device
            )
        rows.append(row)
    return rows


def _format_rows(rows: list[dict[str, Any]], metric: str) -> str:
    return ", ".join(f"{r['name']} {100 * r[metric]:.2f}%" for r in rows)


# --------------------------------------------------------------------------------------------------
# The single-process loop
# --------------------------------------------------------------------------------------------------


def train(
    cfg: TrainConfig,
    task=None,
    *,
    progress: Callable[[str], None] | None = None,
    participant: str = "local/0",
) -> dict[str, Any]:
    """Train a supernet on one process with exactly the pieces above; returns the results.

    ``task`` defaults to ``tasks.get_task(cfg.task, **cfg.task_options)``. ``progress`` receives one
    line every ``cfg.log_every`` steps and after each evaluation (default: this module's logger).
    The result: ``net`` (the trained supernet), ``history`` (per-step loss, lr, seconds), ``evaluations``
    (``(step, rows)`` during training), ``final`` (rows of :func:`evaluate_subnets`), ``seconds``
    (training time, without the final evaluation), ``train_macs``.
    """

    say = progress or log.info
    if task is None:
        task = get_task(cfg.task, **cfg.task_options)
    # One generator for the run's augmentation and dropout draws, in step order.
    generator = torch.Generator().manual_seed(derive_seed("data", cfg.seed) % (2**63))
    net = build_supernet(cfg, task.num_classes, task.input_size[0])
    optimizer = make_optimizer(net, cfg)
    history, evaluations, total_macs = [], [], 0
    started = time.perf_counter()
    for step in range(cfg.total_steps):
        if maybe_sort_channels(net, step, cfg, optimizer):
            say(f"step {step}: sorted channels by importance ({phase_at(step, cfg).name} phase)")
        indices = shard_indices(
            len(task.train_set), cfg.seed, step, [participant], participant, cfg.batch_size
        )
        inputs, targets = training_batch(task, indices, generator)
        configs = step_configs(net, step, cfg)
        stats = accumulate_gradients(net, inputs, targets, configs, cfg, task.loss, generator=generator)
        lr = optimizer_step(net, optimizer, step, cfg)
        total_macs += stats["train_macs"]
        elapsed = time.perf_counter() - started
        history.append({"step": step, "loss": stats["loss"], "lr": lr, "seconds": elapsed})
        if cfg.log_every and (step + 1) % cfg.log_every == 0:
            phase = phase_at(step, cfg)
            say(
                f"step {step + 1}/{cfg.total_steps} [{phase.name}{phase.stage or ''}] "
                f"loss {stats['loss']:.4f} lr {lr:.4f} {elapsed:.0f}s"
            )
        if cfg.eval_every and (step + 1) % cfg.eval_every == 0 and step + 1 < cfg.total_steps:
            rows = evaluate_subnets(net, task, cfg)
            evaluations.append((step + 1, rows))
            say(f"step {step + 1}: {_format_rows(rows, task.metric_name)}")
    seconds = time.perf_counter() - started
    final = evaluate_subnets(net, task, cfg)
    say(f"final after {seconds:.0f}s: {_format_rows(final, task.metric_name)}")
    return {
        "net": net,
        "task": task,
        "history": history,
        "evaluations": evaluations,
        "final": final,
        "seconds": seconds,
        "train_macs": total_macs,
    }
