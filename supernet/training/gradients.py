"""One step's gradients: the sandwich loss over K sub-networks, summed, with no optimizer step.

:func:`accumulate_sandwich` is the model-agnostic core; :func:`accumulate_gradients` is it for a
classification supernet on one batch. :func:`sandwich_flops_per_sample` prices the same work.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from supernet.classification import ClassificationSupernet
from supernet.config import SubnetConfig
from supernet.flops import training_flops_per_sample
from supernet.training.config import TrainConfig

__all__ = [
    "distillation_loss",
    "sandwich_flops_per_sample",
    "accumulate_sandwich",
    "accumulate_gradients",
]


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
    Returns the statistics of :func:`accumulate_gradients`; ``ValueError`` if ``configs`` is empty.
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
    to cross-entropy with ``cfg.label_smoothing``. Dropout masks (``cfg.dropout > 0``) are drawn from
    ``generator``, the computation's own, never torch's global one: without it, ``ValueError``.

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
