"""The optimizer of a training run, its learning-rate schedule, and one optimizer step."""

from __future__ import annotations

import inspect
import math
import sys

import torch
from torch import nn

from supernet.training.config import TrainConfig

__all__ = ["make_optimizer", "lr_at", "optimizer_step"]


def _no_decay(name: str, param: nn.Parameter) -> bool:
    return param.ndim <= 1 or "kernel_transforms" in name


def _leave_dynamo_unimported() -> None:
    """torch wraps an optimizer's methods so that ``torch.compile`` leaves them alone, and the wrapper
    imports ``torch._dynamo`` at its first call (150 MiB and about 2 s of CPU in each worker). MANTA
    compiles nothing: while dynamo is not imported, a wrapped method is what its wrapper would run, so
    the wrapper's cache is set to it. (A torch whose wrapper differs is left as it is.)"""
    if "torch._dynamo" in sys.modules:
        return
    wrapper_code = torch._compile._disable_dynamo(lambda: None).__code__
    for cls in (torch.optim.Optimizer, torch.optim.SGD, torch.optim.AdamW):
        for value in vars(cls).values():
            method = getattr(value, "__func__", value)
            if getattr(method, "__code__", None) is wrapper_code and hasattr(method, "__wrapped__"):
                setattr(method.__wrapped__, "__dynamo_disable", method.__wrapped__)


def make_optimizer(net: nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    """SGD (momentum, Nesterov) or AdamW; weight decay only on conv/linear weights."""
    _leave_dynamo_unimported()
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
    _step(optimizer)
    return lr


def _step(optimizer: torch.optim.Optimizer) -> None:
    """``optimizer.step()`` as torch runs it outside ``torch.compile``: the update under ``no_grad``,
    without the compile guard that imports ``torch._dynamo`` first (see :func:`_leave_dynamo_unimported`).
    An optimizer with step hooks, or a differentiable one, takes torch's own path."""
    if (
        optimizer.defaults.get("differentiable")
        or optimizer._optimizer_step_pre_hooks
        or optimizer._optimizer_step_post_hooks
    ):
        optimizer.step()
        return
    with torch.no_grad():
        inspect.unwrap(type(optimizer).step)(optimizer)
