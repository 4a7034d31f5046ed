"""The elastic 2-D convolution: elastic channels and kernel size, with exact parameter masks."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise

import torch
import torch.nn.functional as F
from torch import nn

from supernet.elastic.masks import Masks, full_masks
from supernet.elastic.permutation import Permutation, permute_in_place
from supernet.elastic.sizes import conv_output_size

__all__ = ["ElasticConv2d"]


class ElasticConv2d(nn.Module):
    """2-D convolution with elastic channels and (optionally) elastic kernel size.

    ``depthwise=True`` makes a depthwise convolution (``groups`` = active channels, output width =
    input width). ``kernel_sizes`` lists the allowed odd sizes; with more than one and
    ``kernel_transform=True`` (default) smaller kernels come from the largest through the learned
    transformation matrices ``kernel_transforms["{K}to{k}"]``; with ``kernel_transform=False`` they
    are plain centre crops. Padding is always ``k // 2`` ("same" at stride 1).

    Mask exactness for the transformations: for an active kernel ``k`` below the largest, the weight
    elements used are the centre ``K1×K1`` of the largest kernel (``K1`` the second-largest size, all
    of whose entries feed the first matrix); the matrix of the last step uses all its rows; an earlier
    step's matrix uses only the rows that produce the centre crop taken by the next step.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_sizes: Sequence[int] = (1,),
        stride: int = 1,
        *,
        depthwise: bool = False,
        bias: bool = False,
        kernel_transform: bool = True,
    ) -> None:
        super().__init__()
        sizes = sorted({int(k) for k in kernel_sizes})
        if not sizes or any(k < 1 or k % 2 == 0 for k in sizes):
            raise ValueError(f"kernel_sizes: need positive odd sizes, got {list(kernel_sizes)}")
        if depthwise and in_channels != out_channels:
            raise ValueError("out_channels: a depthwise convolution keeps its width (in == out)")
        self.in_channels = int(in_channels)
        self.out_channels = int(out_channels)
        self.kernel_sizes = tuple(sizes)
        self.max_kernel = sizes[-1]
        self.stride = int(stride)
        self.depthwise = bool(depthwise)
        self.kernel_transform = bool(kernel_transform) and len(sizes) > 1
        k = self.max_kernel
        self.weight = nn.Parameter(torch.empty(out_channels, 1 if depthwise else in_channels, k, k))
        if bias:
            self.bias = nn.Parameter(torch.empty(out_channels))
        else:
            self.register_parameter("bias", None)
        self.kernel_transforms = nn.ParameterDict()
        if self.kernel_transform:
            chain = sizes[::-1]
            for big, small in pairwise(chain):
                taps = small * small
                self.kernel_transforms[f"{big}to{small}"] = nn.Parameter(torch.empty(taps, taps))
        if not self.weight.is_meta:  # built on "meta" (supernet.init): there is nothing to draw yet,
            self.reset_parameters()  # and normal_ on meta would import torch._dynamo

    @torch.no_grad()
    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        """He-normal weight (fan-out), zero bias, identity kernel transformations; the weight is drawn
        from ``generator`` (``None``: torch's global generator, as torch's own layers do)."""
        nn.init.kaiming_normal_(self.weight, mode="fan_out", generator=generator)
        if self.bias is not None:
            nn.init.zeros_(self.bias)
        for matrix in self.kernel_transforms.values():
            nn.init.eye_(matrix)

    # ---- helpers --------------------------------------------------------------------------------
    def _chain(self, kernel_size: int) -> list[int]:
        """Kernel sizes from the largest down to ``kernel_size``: ``[K0, K1, ..., k]``."""
        if kernel_size not in self.kernel_sizes:
            raise ValueError(f"kernel_size: {kernel_size} is not one of {self.kernel_sizes}")
        return [k for k in reversed(self.kernel_sizes) if k >= kernel_size]

    @staticmethod
    def _centre(size: int, crop: int) -> slice:
        start = (size - crop) // 2
        return slice(start, start + crop)

    def _reachable(self, kernel_size: int, size: int) -> slice:
        """Kernel taps (along one axis) that meet at least one real input pixel, not only padding.

        Output ``y`` reads input ``stride·y + t`` for taps ``t ∈ [-p, p]``; with ``n`` outputs the taps
        that can land inside ``[0, size)`` are ``t ∈ [-stride·(n-1), size-1]``.
        """
        pad = kernel_size // 2
        outputs = (size - 1) // self.stride + 1
        low, high = max(-pad, -self.stride * (outputs - 1)), min(pad, size - 1)
        return slice(low + pad, high + pad + 1)

    def _channels(self, in_channels: int, out_channels: int | None) -> tuple[int, int]:
        if self.depthwise:
            out_channels = in_channels
        elif out_channels is None:
            out_channels = self.out_channels
        if not 0 < in_channels <= self.in_channels:
            raise ValueError(f"in_channels: {in_channels} outside 1..{self.in_channels}")
        if not 0 < out_channels <= self.out_channels:
            raise ValueError(f"out_channels: {out_channels} outside 1..{self.out_channels}")
        return in_channels, out_channels

    def active_weight(
        self, in_channels: int, out_channels: int | None = None, kernel_size: int | None = None
    ):
        """The weight a sub-network uses (sliced, cropped and transformed); differentiable."""
        in_channels, out_channels = self._channels(in_channels, out_channels)
        kernel_size = self.max_kernel if kernel_size is None else kernel_size
        chain = self._chain(kernel_size)
        weight = self.weight[:out_channels] if self.depthwise else self.weight[:out_channels, :in_channels]
        for big, small in pairwise(chain):
            centre = self._centre(big, small)
            weight = weight[:, :, centre, centre]
            if self.kernel_transform:
                matrix = self.kernel_transforms[f"{big}to{small}"]
                shape = weight.shape
                weight = F.linear(weight.reshape(shape[0], shape[1], small * small), matrix).reshape(shape)
        return weight

    # ---- the four methods ---------------------------------------------------------------------------
    def forward(
        self, x: torch.Tensor, out_channels: int | None = None, kernel_size: int | None = None
    ) -> torch.Tensor:
        in_channels = x.shape[1]
        weight = self.active_weight(in_channels, out_channels, kernel_size)
        # On feature maps smaller than the kernel, taps that can only meet zero padding are cropped
        # away: the same result, much less work (e.g. a 7×7 kernel on a 1×1 map is its centre tap).
        kh, kw = weight.shape[-2:]
        eh, ew = min(kh, 2 * x.shape[-2] - 1), min(kw, 2 * x.shape[-1] - 1)
        if eh < kh or ew < kw:
            weight = weight[:, :, self._centre(kh, eh), self._centre(kw, ew)]
        if not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last):
            # keep channels-last activations channels-last (much faster depthwise backward on CPU)
            weight = weight.contiguous(memory_format=torch.channels_last)
        bias = None if self.bias is None else self.bias[: weight.shape[0]]
        groups = in_channels if self.depthwise else 1
        return F.conv2d(x, weight, bias, self.stride, (eh // 2, ew // 2), 1, groups)

    @torch.no_grad()
    def export(
        self, in_channels: int, out_channels: int | None = None, kernel_size: int | None = None
    ) -> nn.Conv2d:
        weight = self.active_weight(in_channels, out_channels, kernel_size).detach().clone()
        out_channels, k = weight.shape[0], weight.shape[-1]
        conv = nn.Conv2d(
            in_channels,
            out_channels,
            k,
            stride=self.stride,
            padding=k // 2,
            groups=in_channels if self.depthwise else 1,
            bias=self.bias is not None,
            device="meta",  # no initial draws from torch's global generator: the weights are copied
            dtype=weight.dtype,
        ).to_empty(device=weight.device)
        conv.weight.copy_(weight)
        if self.bias is not None:
            conv.bias.copy_(self.bias[:out_channels])
        return conv

    def parameter_masks(
        self,
        in_channels: int,
        out_channels: int | None = None,
        kernel_size: int | None = None,
        in_hw: tuple[int, int] | None = None,
    ) -> Masks:
        """Used elements; with ``in_hw`` (input height, width) also leaves out kernel taps that only
        ever meet zero padding on a feature map smaller than the kernel."""
        in_channels, out_channels = self._channels(in_channels, out_channels)
        kernel_size = self.max_kernel if kernel_size is None else kernel_size
        chain = self._chain(kernel_size)
        masks = full_masks(self, False)
        # Walk the kernel chain backwards from the taps the convolution reads: a used output row of a
        # transformation matrix reads its whole input crop; a crop places its needs in the centre.
        needed = torch.zeros(kernel_size, kernel_size, dtype=torch.bool)
        if in_hw is None:
            needed[:] = True
        else:
            needed[self._reachable(kernel_size, in_hw[0]), self._reachable(kernel_size, in_hw[1])] = True
        for big, small in reversed(list(pairwise(chain))):
            if self.kernel_transform:
                masks[f"kernel_transforms.{big}to{small}"][needed.flatten()] = True
                needed = torch.ones(small, small, dtype=torch.bool)
            grid = torch.zeros(big, big, dtype=torch.bool)
            grid[self._centre(big, small), self._centre(big, small)] = needed
            needed = grid
        channel_in = slice(None) if self.depthwise else slice(0, in_channels)
        masks["weight"][:out_channels, channel_in] = needed
        if self.bias is not None:
            masks["bias"][:out_channels] = True
        return masks

    def macs(
        self, in_channels: int, out_channels: int | None, kernel_size: int | None, in_hw: tuple[int, int]
    ) -> tuple[int, tuple[int, int]]:
        in_channels, out_channels = self._channels(in_channels, out_channels)
        k = self.max_kernel if kernel_size is None else kernel_size
        self._chain(k)
        out_hw = (conv_output_size(in_hw[0], k, self.stride), conv_output_size(in_hw[1], k, self.stride))
        per_output = k * k * (1 if self.depthwise else in_channels)
        return out_channels * per_output * out_hw[0] * out_hw[1], out_hw

    # ---- reordering -----------------------------------------------------------------------------
    def permute_out_channels(self, index: torch.Tensor, record: list[Permutation]) -> None:
        permute_in_place(self.weight, 0, index, record)
        if self.bias is not None:
            permute_in_place(self.bias, 0, index, record)

    def permute_in_channels(self, index: torch.Tensor, record: list[Permutation]) -> None:
        if self.depthwise:
            raise ValueError("a depthwise convolution's input channels are its output channels")
        permute_in_place(self.weight, 1, index, record)

    def extra_repr(self) -> str:
        kind = "depthwise, " if self.depthwise else ""
        return (
            f"{self.in_channels}, {self.out_channels}, {kind}kernel_sizes={self.kernel_sizes}, "
            f"stride={self.stride}, transform={self.kernel_transform}"
        )
