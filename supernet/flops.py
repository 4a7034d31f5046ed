"""FLOPs accounting: analytic multiply-adds, training cost per sample, and a torch cross-check.

Convention (once-for-all): "FLOPs" here are multiply-accumulates (MACs) of convolutions and linear
layers; batch norm, activations, pooling and additions are not counted. ``torch.utils.flop_counter``
counts 2 FLOPs per MAC, so :func:`torch_counted_macs` halves it.

Training one sample costs about three forward passes (forward, gradient w.r.t. activations, gradient
w.r.t. weights); :func:`training_flops_per_sample` is what the contribution ledger credits.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from supernet.config import SubnetConfig

__all__ = ["TRAINING_FLOPS_FACTOR", "training_flops_per_sample", "torch_counted_macs"]

TRAINING_FLOPS_FACTOR = 3
"""Training MACs per sample = this × forward MACs (forward + two backward products)."""


class _CountsFlops(Protocol):
    def flops(self, cfg: SubnetConfig | None, input_size: Sequence[int]) -> int: ...


def training_flops_per_sample(net: _CountsFlops, cfg: SubnetConfig, input_size: Sequence[int]) -> int:
    """Multiply-adds to train ``cfg`` on one sample: ``3 × net.flops(cfg, input_size)``."""
    return TRAINING_FLOPS_FACTOR * int(net.flops(cfg, input_size))


def torch_counted_macs(model: nn.Module, example_input: torch.Tensor, backward: bool = False) -> float:
    """MACs per sample of ``model`` as ``torch.utils.flop_counter`` counts them (its FLOPs / 2).

    With ``backward=True`` the backward pass of a sum of the outputs is counted too.
    """
    was_training = model.training
    model.eval()
    x = example_input.detach().clone().requires_grad_(False)
    with FlopCounterMode(display=False) as counter:
        out = model(x)
        if backward:
            out.float().sum().backward()
    model.train(was_training)
    return counter.get_total_flops() / 2 / x.shape[0]
