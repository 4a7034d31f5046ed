"""Elastic batch norm: the first ``C`` channels of shared parameters and running statistics."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from supernet.elastic.masks import Masks, full_masks
from supernet.elastic.permutation import Permutation, permute_in_place

__all__ = ["ElasticBatchNorm2d"]


class ElasticBatchNorm2d(nn.BatchNorm2d):
    """Batch norm over the first ``x.shape[1]`` channels of shared parameters and running statistics.

    All sub-networks share (and in training mode update) one set of running statistics, so they are
    only meaningful after :func:`supernet.recalibrate_bn` for the sub-network to be evaluated.
    ``zero_init``: the scale starts at 0 rather than 1 (the last BN of a residual block).
    """

    def __init__(self, num_features: int, *, zero_init: bool = False, **kwargs) -> None:
        super().__init__(num_features, **kwargs)
        self.zero_init = bool(zero_init)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Fresh statistics, shift 0, scale 1 (0 with ``zero_init``); nothing random."""
        super().reset_parameters()
        if self.affine and getattr(self, "zero_init", False):  # BatchNorm2d.__init__ calls this first
            nn.init.zeros_(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        channels = x.shape[1]
        if channels > self.num_features:
            raise ValueError(f"channels: {channels} exceeds {self.num_features}")
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            factor = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
        use_batch_stats = self.training or self.running_mean is None
        track = not self.training or self.track_running_stats
        return F.batch_norm(
            x,
            self.running_mean[:channels] if track and self.running_mean is not None else None,
            self.running_var[:channels] if track and self.running_var is not None else None,
            None if self.weight is None else self.weight[:channels],
            None if self.bias is None else self.bias[:channels],
            use_batch_stats,
            factor,
            self.eps,
        )

    @torch.no_grad()
    def export(self, channels: int) -> nn.BatchNorm2d:
        bn = nn.BatchNorm2d(channels, eps=self.eps, momentum=self.momentum, affine=self.affine)
        if self.affine:
            bn.weight.copy_(self.weight[:channels])
            bn.bias.copy_(self.bias[:channels])
        if self.running_mean is not None:
            bn.running_mean.copy_(self.running_mean[:channels])
            bn.running_var.copy_(self.running_var[:channels])
            bn.num_batches_tracked.copy_(self.num_batches_tracked)
        return bn

    def parameter_masks(self, channels: int) -> Masks:
        masks = full_masks(self, False)
        for mask in masks.values():
            mask[:channels] = True
        return masks

    def permute_channels(self, index: torch.Tensor, record: list[Permutation]) -> None:
        for tensor in (self.weight, self.bias, self.running_mean, self.running_var):
            if tensor is not None:
                permute_in_place(tensor, 0, index, record)
