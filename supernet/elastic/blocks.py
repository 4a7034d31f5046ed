"""Elastic blocks: the inverted-residual block (elastic kernel and width) and the unit (elastic depth)."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise

import torch
from torch import nn

from supernet.elastic.batchnorm import ElasticBatchNorm2d
from supernet.elastic.conv import ElasticConv2d
from supernet.elastic.masks import Masks, full_masks, prefix_masks
from supernet.elastic.permutation import Permutation
from supernet.elastic.sizes import make_divisible
from supernet.export import InvertedResidual, make_activation

__all__ = ["ElasticMBConv", "ElasticUnit"]


class ElasticMBConv(nn.Module):
    """Inverted-residual block with elastic kernel size and expand ratio.

    ``expand_conv`` (1×1, in → mid) + BN + activation, ``depthwise_conv`` (k×k, stride) + BN +
    activation, ``project_conv`` (1×1, mid → out) + BN, plus an identity shortcut when the stride is 1
    and ``in == out``. The middle width for expand ratio ``e`` is
    ``make_divisible(in_channels * e, channel_divisor)`` (the first ``mid`` channels of the shared
    layers). With ``zero_init_residual`` the last BN's scale starts at 0, so a residual block starts
    as the identity (BigNAS), which keeps deep and shallow sub-networks consistent early in training.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        stride: int,
        kernel_sizes: Sequence[int],
        expand_ratios: Sequence[float],
        *,
        channel_divisor: int = 8,
        activation: str = "relu",
        kernel_transform: bool = True,
        zero_init_residual: bool = True,
    ) -> None:
        super().__init__()
        self.in_channels = int(in_channels)
        self.out_channels = int(out_channels)
        self.stride = int(stride)
        self.channel_divisor = int(channel_divisor)
        self.expand_ratios = tuple(sorted(expand_ratios))
        self.kernel_sizes = tuple(sorted(kernel_sizes))
        self.activation = activation
        self.mid_channels_max = max(self._mid(e) for e in self.expand_ratios)
        mid = self.mid_channels_max
        self.expand_conv = ElasticConv2d(in_channels, mid)
        self.expand_bn = ElasticBatchNorm2d(mid)
        self.depthwise_conv = ElasticConv2d(
            mid, mid, kernel_sizes, stride, depthwise=True, kernel_transform=kernel_transform
        )
        self.depthwise_bn = ElasticBatchNorm2d(mid)
        self.project_conv = ElasticConv2d(mid, out_channels)
        self.residual = self.stride == 1 and self.in_channels == self.out_channels
        self.project_bn = ElasticBatchNorm2d(out_channels, zero_init=self.residual and zero_init_residual)
        self.act = make_activation(activation)

    def _mid(self, expand_ratio: float) -> int:
        return make_divisible(self.in_channels * expand_ratio, self.channel_divisor)

    def mid_channels(self, expand_ratio: float) -> int:
        """Active middle width for ``expand_ratio`` (must be one of the block's ratios)."""
        if expand_ratio not in self.expand_ratios:
            raise ValueError(f"expand_ratio: {expand_ratio} is not one of {self.expand_ratios}")
        return min(self._mid(expand_ratio), self.mid_channels_max)

    def forward(self, x: torch.Tensor, kernel_size: int, expand_ratio: float) -> torch.Tensor:
        mid = self.mid_channels(expand_ratio)
        out = self.act(self.expand_bn(self.expand_conv(x, out_channels=mid)))
        out = self.act(self.depthwise_bn(self.depthwise_conv(out, kernel_size=kernel_size)))
        out = self.project_bn(self.project_conv(out))
        return out + x if self.residual else out

    @torch.no_grad()
    def export(self, kernel_size: int, expand_ratio: float) -> InvertedResidual:
        mid = self.mid_channels(expand_ratio)
        body = nn.Sequential(
            self.expand_conv.export(self.in_channels, mid),
            self.expand_bn.export(mid),
            make_activation(self.activation),
            self.depthwise_conv.export(mid, kernel_size=kernel_size),
            self.depthwise_bn.export(mid),
            make_activation(self.activation),
            self.project_conv.export(mid, self.out_channels),
            self.project_bn.export(self.out_channels),
        )
        return InvertedResidual(body, self.residual)

    def parameter_masks(
        self, kernel_size: int, expand_ratio: float, in_hw: tuple[int, int] | None = None
    ) -> Masks:
        """Used elements (``in_hw``: the block's input size, see :meth:`ElasticConv2d.parameter_masks`)."""
        mid = self.mid_channels(expand_ratio)
        masks: Masks = {}
        masks.update(prefix_masks("expand_conv", self.expand_conv.parameter_masks(self.in_channels, mid)))
        masks.update(prefix_masks("expand_bn", self.expand_bn.parameter_masks(mid)))
        masks.update(
            prefix_masks("depthwise_conv", self.depthwise_conv.parameter_masks(mid, mid, kernel_size, in_hw))
        )
        masks.update(prefix_masks("depthwise_bn", self.depthwise_bn.parameter_masks(mid)))
        masks.update(prefix_masks("project_conv", self.project_conv.parameter_masks(mid, self.out_channels)))
        masks.update(prefix_masks("project_bn", self.project_bn.parameter_masks(self.out_channels)))
        return masks

    def macs(
        self, kernel_size: int, expand_ratio: float, in_hw: tuple[int, int]
    ) -> tuple[int, tuple[int, int]]:
        mid = self.mid_channels(expand_ratio)
        expand, hw = self.expand_conv.macs(self.in_channels, mid, 1, in_hw)
        depthwise, hw = self.depthwise_conv.macs(mid, mid, kernel_size, hw)
        project, hw = self.project_conv.macs(mid, self.out_channels, 1, hw)
        return expand + depthwise + project, hw

    @torch.no_grad()
    def channel_importance(self) -> torch.Tensor:
        """L1 norm of the projection weights reading each middle channel (float64, CPU)."""
        return self.project_conv.weight.detach().to("cpu", torch.float64).abs().sum(dim=(0, 2, 3))

    @torch.no_grad()
    def sort_channels(self, protected_expand_ratios: Sequence[float] = ()) -> list[Permutation]:
        """Reorder the middle channels by decreasing importance; return what was permuted.

        Channels are sorted within bands whose edges are the middle widths of
        ``protected_expand_ratios``: channels that already make up a narrower sub-network stay in it
        (they are only reordered among themselves), which keeps the nesting of widths trained before.
        The sort is stable (ties keep index order) and deterministic.
        """
        importance = self.channel_importance()
        edges = sorted({self.mid_channels(e) for e in protected_expand_ratios} | {0, self.mid_channels_max})
        pieces = []
        for lo, hi in pairwise(edges):
            order = torch.sort(importance[lo:hi], descending=True, stable=True).indices
            pieces.append(order + lo)
        index = torch.cat(pieces)
        record: list[Permutation] = []
        if torch.equal(index, torch.arange(self.mid_channels_max)):
            return record
        self.expand_conv.permute_out_channels(index, record)
        self.expand_bn.permute_channels(index, record)
        self.depthwise_conv.permute_out_channels(index, record)
        self.depthwise_bn.permute_channels(index, record)
        self.project_conv.permute_in_channels(index, record)
        return record


class ElasticUnit(nn.Module):
    """``max(depths)`` elastic blocks of which the first ``depth`` run (elastic depth).

    The first block has the unit's stride and changes the width ``in_channels → out_channels``; the
    others keep stride 1 and the width (identity shortcut), so dropping them is safe.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        stride: int,
        kernel_sizes: Sequence[int],
        expand_ratios: Sequence[float],
        depths: Sequence[int],
        **block_options,
    ) -> None:
        super().__init__()
        self.depths = tuple(sorted(depths))
        if self.depths[0] < 1:
            raise ValueError("depths: a unit runs at least its first block")
        self.blocks = nn.ModuleList(
            ElasticMBConv(
                in_channels if i == 0 else out_channels,
                out_channels,
                stride if i == 0 else 1,
                kernel_sizes,
                expand_ratios,
                **block_options,
            )
            for i in range(self.depths[-1])
        )

    def _check(self, depth: int, kernel_sizes: Sequence[int], expand_ratios: Sequence[float]) -> None:
        if depth not in self.depths:
            raise ValueError(f"depth: {depth} is not one of {self.depths}")
        if len(kernel_sizes) != depth or len(expand_ratios) != depth:
            raise ValueError(f"kernel_sizes/expand_ratios: need one per active block ({depth})")

    def forward(
        self, x: torch.Tensor, depth: int, kernel_sizes: Sequence[int], expand_ratios: Sequence[float]
    ) -> torch.Tensor:
        self._check(depth, kernel_sizes, expand_ratios)
        for block, k, e in zip(self.blocks[:depth], kernel_sizes, expand_ratios, strict=True):
            x = block(x, k, e)
        return x

    @torch.no_grad()
    def export(
        self, depth: int, kernel_sizes: Sequence[int], expand_ratios: Sequence[float]
    ) -> nn.Sequential:
        self._check(depth, kernel_sizes, expand_ratios)
        return nn.Sequential(
            *(
                b.export(k, e)
                for b, k, e in zip(self.blocks[:depth], kernel_sizes, expand_ratios, strict=True)
            )
        )

    def parameter_masks(
        self,
        depth: int,
        kernel_sizes: Sequence[int],
        expand_ratios: Sequence[float],
        in_hw: tuple[int, int] | None = None,
    ) -> Masks:
        """Masks for every parameter of the unit; blocks beyond ``depth`` are all False."""
        self._check(depth, kernel_sizes, expand_ratios)
        masks = full_masks(self, False)
        hw = in_hw
        for i, (k, e) in enumerate(zip(kernel_sizes, expand_ratios, strict=True)):
            block = self.blocks[i]
            masks.update(prefix_masks(f"blocks.{i}", block.parameter_masks(k, e, hw)))
            if hw is not None:
                hw = block.macs(k, e, hw)[1]
        return masks

    def macs(
        self, depth: int, kernel_sizes: Sequence[int], expand_ratios: Sequence[float], in_hw: tuple[int, int]
    ) -> tuple[int, tuple[int, int]]:
        self._check(depth, kernel_sizes, expand_ratios)
        total, hw = 0, in_hw
        for block, k, e in zip(self.blocks[:depth], kernel_sizes, expand_ratios, strict=True):
            macs, hw = block.macs(k, e, hw)
            total += macs
        return total, hw

    def sort_channels(self, protected_expand_ratios: Sequence[float] = ()) -> list[Permutation]:
        record: list[Permutation] = []
        for block in self.blocks:
            record.extend(block.sort_channels(protected_expand_ratios))
        return record
