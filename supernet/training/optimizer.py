"""The optimizer of a training run, its learning-rate schedule, and one optimizer step."""

from __future__ import annotations

import math

import torch
from torch import nn

from supernet.training.config import TrainConfig

__all__ = ["make_optimizer", "lr_at", "optimizer_step"]


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
