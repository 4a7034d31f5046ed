"""Batch-norm recalibration: running statistics for one sub-network before it is evaluated.

All sub-networks share one set of BN running statistics, which training mixes across sub-networks,
so they are recomputed for the chosen sub-network ("post-training BN", US-Nets / once-for-all):
reset, then a cumulative average over ``num_batches`` training batches in train mode, without
gradients. Only the statistics change; parameters are untouched.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import islice
from typing import Any

import torch
from torch import nn

from supernet.config import SubnetConfig

__all__ = ["recalibrate_bn"]


def _inputs(batch: Any) -> torch.Tensor:
    if isinstance(batch, torch.Tensor):
        return batch
    if isinstance(batch, (list, tuple)) and batch and isinstance(batch[0], torch.Tensor):
        return batch[0]
    if isinstance(batch, dict) and "input" in batch:
        return batch["input"]
    raise TypeError("recalibrate_bn: batches must be tensors, (inputs, targets) pairs or {'input': ...}")


@torch.no_grad()
def recalibrate_bn(net: nn.Module, cfg: SubnetConfig | None, loader: Iterable, num_batches: int) -> nn.Module:
    """Recompute every BN layer's running statistics for ``cfg`` from ``num_batches`` of ``loader``.

    ``net`` must have ``set_active(cfg)`` (``cfg=None`` keeps the active sub-network). Batches are
    tensors, ``(inputs, targets, ...)`` tuples, or dicts with an ``"input"`` entry (moved to the
    net's device). The net's training/eval mode is restored; the active config stays ``cfg``.
    """
    if num_batches < 1:
        raise ValueError(f"num_batches: need at least one batch, got {num_batches}")
    if cfg is not None:
        net.set_active(cfg)
    device = next(net.parameters()).device
    norms = [
        m for m in net.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats
    ]
    saved = [(m, m.momentum) for m in norms]
    was_training = net.training
    try:
        for m in norms:
            m.reset_running_stats()
            m.momentum = None  # cumulative moving average over the calibration batches
        net.train()
        seen = 0
        for batch in islice(loader, num_batches):
            net(_inputs(batch).to(device))
            seen += 1
        if seen == 0:
            raise ValueError("loader: gave no batches for BN recalibration")
    finally:
        for m, momentum in saved:
            m.momentum = momentum
        net.train(was_training)
    return net
