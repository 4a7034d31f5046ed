"""Elastic operations: layers whose active kernel size, width and depth are chosen per forward pass.

Stable API, shared by the classification and the stereo supernets. Every elastic op follows the same
four-method pattern, all driven by explicit arguments (no hidden "active" state at this level):

* ``forward(x, ...)`` — the active *input* width is read from ``x.shape[1]``; the active output width
  and kernel size are arguments;
* ``export(...) -> nn.Module`` — a static plain-torch layer with the sliced (and kernel-transformed)
  weights copied, giving the same output in eval mode;
* ``parameter_masks(...) -> dict[str, BoolTensor]`` — for every parameter of the op (keys relative to
  the op, as in ``named_parameters()``), which elements the active configuration uses. Exact: an
  element is marked if and only if it can receive a gradient (see :class:`ElasticConv2d` for the
  kernel-transformation matrices, where only some rows are used);
* ``macs(..., in_hw) -> (multiply_adds, out_hw)`` — analytic multiply-accumulate count.

Ops:

* :class:`ElasticConv2d` — prefix-sliced input/output channels; optional elastic kernel size, the
  largest kernel's centre transformed to each smaller size by learned kernel-transformation matrices
  (once-for-all, Cai et al. 2020): from the largest size ``K0`` down the chain ``K0 > K1 > ... > k``,
  each step crops the centre ``K(i+1)×K(i+1)`` of the current kernel and multiplies its flattened
  values by a ``K(i+1)²×K(i+1)²`` matrix (initialised to the identity, shared across channels).
* :class:`ElasticBatchNorm2d` — batch norm over the first ``C`` channels of shared parameters and
  running statistics (recalibrate the statistics per sub-network before evaluating it).
* :class:`ElasticLinear` — prefix-sliced input features.
* :class:`ElasticMBConv` — an inverted-residual (MobileNetV2/V3) block with elastic kernel size and
  expand ratio (elastic width of the middle layer), plus channel sorting by importance.
* :class:`ElasticUnit` — a stack of blocks with elastic depth (runs its first ``d`` blocks); the first
  block carries the stride and the channel change, the others have identity shortcuts.

Channel sorting (:meth:`ElasticMBConv.sort_channels`) reorders the middle channels of a block by
importance (L1 norm of the projection weights that read each channel, computed in float64 on the
CPU; ties keep their index order), so narrower sub-networks keep the most important channels. It is
a pure function of the parameters: peers with identical parameters end with identical parameters.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise

import torch
import torch.nn.functional as F
from torch import nn

from supernet.export import InvertedResidual, make_activation

__all__ = [
    "make_divisible",
    "conv_output_size",
    "ElasticConv2d",
    "ElasticBatchNorm2d",
    "ElasticLinear",
    "ElasticMBConv",
    "ElasticUnit",
    "Permutation",
    "prefix_masks",
    "full_masks",
    "permute_optimizer_state",
]

Masks = dict[str, torch.Tensor]
Permutation = tuple[nn.Parameter | torch.Tensor, int, torch.Tensor]
"""A record of one reordering: (tensor, dim, index) — ``tensor`` was replaced by ``tensor.index_select(dim, index)``."""


def make_divisible(value: float, divisor: int = 8, min_value: int | None = None) -> int:
    """Round ``value`` to a multiple of ``divisor`` (at least ``min_value``), never more than 10 % down."""
    if divisor < 1:
        raise ValueError(f"channel_divisor: {divisor} is not a positive integer")
    min_value = divisor if min_value is None else min_value
    rounded = max(min_value, int(value + divisor / 2) // divisor * divisor)
    if rounded < 0.9 * value:
        rounded += divisor
    return int(rounded)


def conv_output_size(size: int, kernel_size: int, stride: int, padding: int | None = None) -> int:
    padding = kernel_size // 2 if padding is None else padding
    return (size + 2 * padding - kernel_size) // stride + 1


def prefix_masks(prefix: str, masks: Masks) -> Masks:
    return {f"{prefix}.{name}": mask for name, mask in masks.items()}


def full_masks(module: nn.Module, value: bool = True) -> Masks:
    """A mask for every parameter of ``module``, all ``value``."""
    return {name: torch.full(p.shape, value, dtype=torch.bool) for name, p in module.named_parameters()}


@torch.no_grad()
def _permute(tensor: torch.Tensor, dim: int, index: torch.Tensor, record: list[Permutation]) -> None:
    tensor.copy_(tensor.index_select(dim, index.to(tensor.device)))
    record.append((tensor, dim, index))


@torch.no_grad()
def permute_optimizer_state(optimizer: torch.optim.Optimizer, record: Sequence[Permutation]) -> None:
    """Apply channel reorderings to an optimizer's per-parameter state (momentum, Adam moments).

    Every state tensor of a reordered parameter that has the parameter's shape is permuted the same
    way, so training continues exactly as if the channels had always been in the new order.
    """
    for tensor, dim, index in record:
        state = optimizer.state.get(tensor)
        if not state:
            continue
        for value in state.values():
            if isinstance(value, torch.Tensor) and value.shape == tensor.shape:
                value.copy_(value.index_select(dim, index.to(value.device)))


# --------------------------------------------------------------------------------------------------
# Primitive ops
# --------------------------------------------------------------------------------------------------


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
            self.reset_parameters()  # and normal_ on meta imports torch._dynamo (1.7 s of CPU)

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
        _permute(self.weight, 0, index, record)
        if self.bias is not None:
            _permute(self.bias, 0, index, record)

    def permute_in_channels(self, index: torch.Tensor, record: list[Permutation]) -> None:
        if self.depthwise:
            raise ValueError("a depthwise convolution's input channels are its output channels")
        _permute(self.weight, 1, index, record)

    def extra_repr(self) -> str:
        kind = "depthwise, " if self.depthwise else ""
        return (
            f"{self.in_channels}, {self.out_channels}, {kind}kernel_sizes={self.kernel_sizes}, "
            f"stride={self.stride}, transform={self.kernel_transform}"
        )


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
                _permute(tensor, 0, index, record)


class ElasticLinear(nn.Linear):
    """A linear layer over the first ``x.shape[-1]`` input features (optionally fewer outputs)."""

    def forward(self, x: torch.Tensor, out_features: int | None = None) -> torch.Tensor:
        out_features = self.out_features if out_features is None else out_features
        bias = None if self.bias is None else self.bias[:out_features]
        return F.linear(x, self.weight[:out_features, : x.shape[-1]], bias)

    @torch.no_grad()
    def export(self, in_features: int, out_features: int | None = None) -> nn.Linear:
        out_features = self.out_features if out_features is None else out_features
        linear = nn.Linear(  # on meta: no draws from torch's global generator, the weights are copied
            in_features, out_features, bias=self.bias is not None, device="meta", dtype=self.weight.dtype
        ).to_empty(device=self.weight.device)
        linear.weight.copy_(self.weight[:out_features, :in_features])
        if self.bias is not None:
            linear.bias.copy_(self.bias[:out_features])
        return linear

    def parameter_masks(self, in_features: int, out_features: int | None = None) -> Masks:
        out_features = self.out_features if out_features is None else out_features
        masks = full_masks(self, False)
        masks["weight"][:out_features, :in_features] = True
        if self.bias is not None:
            masks["bias"][:out_features] = True
        return masks

    def macs(self, in_features: int, out_features: int | None = None) -> int:
        return in_features * (self.out_features if out_features is None else out_features)


# --------------------------------------------------------------------------------------------------
# Blocks
# --------------------------------------------------------------------------------------------------


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
