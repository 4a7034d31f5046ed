"""The classification once-for-all supernet.

Layout (MobileNetV3-like, sized for small images by default)::

    stem      3×3 conv (stride ``stem_stride``) + BN + activation          fixed
    units[0..4]  ElasticUnit: first block stride 2 (halves H and W),      elastic kernel, expand, depth
                 then up to max(depths)-1 stride-1 residual blocks
    head      1×1 conv to ``head_channels`` + BN + activation               fixed
    pool      global average
    classifier  linear → logits; in eval mode ``forward`` returns softmax probabilities

``forward`` returns logits in training mode (what the losses take) and softmax probabilities per class
in eval mode (the inference output, as the exported model does); ``logits(x)`` always returns logits.
The active sub-network is chosen with :meth:`set_active` (default: the largest).

Randomness comes only from explicit ``torch.Generator`` arguments, never from torch's global
generator, which all threads of a process share (an audit replaying a peer's gradient in one thread
of the aggregator must not see another thread's draws): :meth:`reset_parameters` draws the initial
weights from one, and the dropout mask is drawn from the ``generator`` given to :meth:`logits` /
:meth:`forward` for that one computation (the module holds none, so threads never share one).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from torch import nn

from supernet.config import RandomLike, SearchSpace, SubnetConfig
from supernet.elastic.blocks import ElasticUnit
from supernet.elastic.conv import ElasticConv2d
from supernet.elastic.masks import full_masks, prefix_masks
from supernet.elastic.permutation import Permutation, permute_optimizer_state
from supernet.elastic.sizes import conv_output_size, make_divisible
from supernet.export import StaticClassifier, make_activation

__all__ = ["ClassificationSupernet", "DEFAULT_UNIT_CHANNELS"]

DEFAULT_UNIT_CHANNELS = (24, 40, 80, 112, 160)
"""Output width of each unit at ``width_mult=1`` (the once-for-all MobileNetV3 stages)."""

DEFAULT_ACTIVATIONS = ("relu", "relu", "hswish", "hswish", "hswish")


def _dropout(x: torch.Tensor, p: float, generator: torch.Generator) -> torch.Tensor:
    """Inverted dropout (what ``nn.Dropout`` computes) with the keep-mask drawn from ``generator``
    on the CPU, so it is the same on every device."""
    keep = torch.rand(x.shape, generator=generator) >= p
    return x * keep.to(device=x.device, dtype=x.dtype) / (1.0 - p)


class ClassificationSupernet(nn.Module):
    """A once-for-all classification supernet with ``space.num_units`` (default 5) elastic units.

    Args:
        num_classes: classifier outputs.
        in_channels: image channels (1 for grey digits, 3 for RGB).
        space: the elastic choices (default: kernel {3,5,7}, expand {3,4,6}, depth {2,3,4}, 5 units).
        width_mult: scales every width (stem, units, head) before rounding to ``channel_divisor``.
        stem_channels, unit_channels, head_channels: widths at ``width_mult=1``.
        channel_divisor: widths (and middle widths) are multiples of this.
        activations: one per unit (``relu``, ``relu6``, ``hswish``, ``silu``); the stem uses the first,
            the head the last.
        stem_stride: 1 for 32×32 inputs (5 stride-2 units bring them to 1×1), 2 for ImageNet sizes.
        dropout: before the classifier, training only, with its mask drawn from the ``generator``
            passed to :meth:`logits` (no generator: no dropout; see :meth:`logits`).
        kernel_transform: learned kernel-transformation matrices (True) or plain centre crops.
    """

    def __init__(
        self,
        num_classes: int,
        in_channels: int = 3,
        space: SearchSpace | None = None,
        *,
        width_mult: float = 1.0,
        stem_channels: int = 16,
        unit_channels: Sequence[int] = DEFAULT_UNIT_CHANNELS,
        head_channels: int = 640,
        channel_divisor: int = 8,
        activations: Sequence[str] = DEFAULT_ACTIVATIONS,
        stem_stride: int = 1,
        dropout: float = 0.0,
        kernel_transform: bool = True,
    ) -> None:
        super().__init__()
        space = SearchSpace() if space is None else space
        if not isinstance(space, SearchSpace):
            raise ValueError(f"space: expected a SearchSpace, got {type(space).__name__}")
        if num_classes < 1:
            raise ValueError(f"num_classes: {num_classes} is not a positive number of classes")
        if len(unit_channels) != space.num_units:
            raise ValueError(f"unit_channels: {len(unit_channels)} widths for {space.num_units} units")
        if len(activations) != space.num_units:
            raise ValueError(f"activations: {len(activations)} activations for {space.num_units} units")
        if width_mult <= 0:
            raise ValueError(f"width_mult: {width_mult} is not positive")
        self.space = space
        self.num_classes = int(num_classes)
        self.in_channels = int(in_channels)
        self.channel_divisor = int(channel_divisor)

        def scaled(width: int) -> int:
            return make_divisible(width * width_mult, channel_divisor)

        self.stem_channels = scaled(stem_channels)
        self.unit_channels = tuple(scaled(c) for c in unit_channels)
        self.head_channels = scaled(head_channels)
        self.activations = tuple(activations)
        self.stem_stride = int(stem_stride)

        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, self.stem_channels, 3, self.stem_stride, 1, bias=False),
            nn.BatchNorm2d(self.stem_channels),
            make_activation(self.activations[0]),
        )
        units, width = [], self.stem_channels
        for out_channels, act in zip(self.unit_channels, self.activations, strict=True):
            units.append(
                ElasticUnit(
                    width,
                    out_channels,
                    2,
                    space.kernel_sizes,
                    space.expand_ratios,
                    space.depths,
                    channel_divisor=channel_divisor,
                    activation=act,
                    kernel_transform=kernel_transform,
                )
            )
            width = out_channels
        self.units = nn.ModuleList(units)
        self.head = nn.Sequential(
            nn.Conv2d(width, self.head_channels, 1, bias=False),
            nn.BatchNorm2d(self.head_channels),
            make_activation(self.activations[-1]),
        )
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout: {dropout} is not in [0, 1)")
        self.dropout = float(dropout)
        self.classifier = nn.Linear(self.head_channels, num_classes)
        if not self.classifier.weight.is_meta:  # as ElasticConv2d: supernet.init draws them later
            self.reset_parameters()
        self.active: SubnetConfig = space.largest()
        # Run activations in channels-last memory format (parameters stay contiguous): on CPU the
        # depthwise-convolution backward is several times faster. Numerically the same network.
        self.channels_last = True

    @torch.no_grad()
    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        """The initial weights, drawn from ``generator`` (``None``: torch's global one, as a plain
        constructor does; :func:`supernet.training.build.build_supernet` passes one seeded by the config).

        Convolutions He-normal (fan-out), batch norms scale 1 (0 for the last BN of residual blocks)
        and shift 0 with fresh statistics, the classifier N(0, 0.01²) with zero bias, kernel
        transformations the identity. Modules are visited in registration order, so the same
        generator state always gives the same weights."""
        for m in self.modules():
            if isinstance(m, ElasticConv2d):
                m.reset_parameters(generator)
            elif isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", generator=generator)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.reset_parameters()
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0.0, 0.01, generator=generator)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)

    # ---- configs --------------------------------------------------------------------------------
    def largest_config(self) -> SubnetConfig:
        return self.space.largest()

    def smallest_config(self) -> SubnetConfig:
        return self.space.smallest()

    def sample_config(self, rng: RandomLike) -> SubnetConfig:
        """A uniformly random config (see :meth:`SearchSpace.sample`); never touches global RNG state."""
        return self.space.sample(rng)

    def set_active(self, cfg: SubnetConfig) -> ClassificationSupernet:
        """Make ``cfg`` the sub-network that ``forward`` runs (``ValueError`` naming the bad field)."""
        self.active = self.space.validate(cfg)
        return self

    def _units(self, cfg: SubnetConfig):
        return zip(self.units, cfg.depths, cfg.kernel_sizes, cfg.expand_ratios, strict=True)

    # ---- forward --------------------------------------------------------------------------------
    def logits(self, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """Logits of the active sub-network. In training mode with ``dropout > 0``, the dropout mask
        comes from ``generator`` (a CPU generator, per computation); without one no dropout is
        applied: the forward passes that give none (BN recalibration) only need the batch-norm
        statistics, all of which lie before the dropout."""
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        x = self.stem(x)
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        for unit, depth, kernels, expands in self._units(self.active):
            x = unit(x, depth, kernels, expands)
        x = self.head(x)
        x = torch.flatten(torch.mean(x, dim=(2, 3)), 1)
        if self.training and self.dropout > 0.0 and generator is not None:
            x = _dropout(x, self.dropout, generator)
        return self.classifier(x)

    def forward(self, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """Logits in training mode, softmax probabilities in eval mode (``generator``: see :meth:`logits`)."""
        logits = self.logits(x, generator)
        return logits if self.training else torch.softmax(logits, dim=1)

    # ---- export ---------------------------------------------------------------------------------
    @torch.no_grad()
    def export(self, cfg: SubnetConfig | None = None) -> StaticClassifier:
        """A standalone plain-torch model of ``cfg`` (default: the active one), in eval mode.

        Weights are copied (kernel transformations applied), including BN running statistics, so
        recalibrate BN for ``cfg`` first (:func:`supernet.recalibrate_bn`).
        """
        cfg = self.active if cfg is None else self.space.validate(cfg)
        units = nn.ModuleList(unit.export(d, ks, es) for unit, d, ks, es in self._units(cfg))
        model = StaticClassifier(
            copy.deepcopy(self.stem), units, copy.deepcopy(self.head), copy.deepcopy(self.classifier)
        )
        for p in model.parameters():
            p.requires_grad_(True)
        return model.eval()

    # ---- accounting -----------------------------------------------------------------------------
    def _spatial(self, input_size: Sequence[int]) -> tuple[int, int]:
        size = tuple(int(s) for s in input_size)
        if len(size) == 3:
            if size[0] != self.in_channels:
                raise ValueError(f"input_size: {size[0]} channels, the supernet takes {self.in_channels}")
            size = size[1:]
        if len(size) != 2 or min(size) < 1:
            raise ValueError(f"input_size: expected (H, W) or (C, H, W), got {tuple(input_size)}")
        return size

    def flops(self, cfg: SubnetConfig | None = None, input_size: Sequence[int] = (32, 32)) -> int:
        """Multiply-accumulates of one forward pass of one sample (convolutions and the classifier).

        Batch norm, activations, pooling and additions are not counted (the once-for-all
        convention); ``torch.utils.flop_counter`` reports exactly twice this on the exported model.
        """
        cfg = self.active if cfg is None else self.space.validate(cfg)
        h, w = self._spatial(input_size)
        h, w = conv_output_size(h, 3, self.stem_stride), conv_output_size(w, 3, self.stem_stride)
        total = self.in_channels * self.stem_channels * 9 * h * w
        for unit, depth, kernels, expands in self._units(cfg):
            macs, (h, w) = unit.macs(depth, kernels, expands, (h, w))
            total += macs
        total += self.unit_channels[-1] * self.head_channels * h * w
        total += self.head_channels * self.num_classes
        return int(total)

    def parameter_masks(
        self, cfg: SubnetConfig | None = None, input_size: Sequence[int] | None = None
    ) -> dict[str, torch.Tensor]:
        """For every entry of ``named_parameters()``, a bool tensor of the elements ``cfg`` uses.

        Fixed layers (stem, head, classifier) are fully used; blocks beyond a unit's depth are unused;
        inside a block, the first ``mid`` middle channels, the kernel region and the
        kernel-transformation rows that ``cfg`` reads. Elements outside the mask never receive a
        gradient from ``cfg``. With ``input_size`` the masks are exact for that size: they also leave
        out depthwise taps that only meet zero padding on feature maps smaller than the kernel (e.g.
        all but the centre of a 7×7 kernel on a 1×1 map); without it those taps are included — they
        get zero gradient on such small maps, for every sub-network alike.
        """
        cfg = self.active if cfg is None else self.space.validate(cfg)
        hw = None
        if input_size is not None:
            h, w = self._spatial(input_size)
            hw = (conv_output_size(h, 3, self.stem_stride), conv_output_size(w, 3, self.stem_stride))
        masks = full_masks(self, True)
        for i, (unit, depth, kernels, expands) in enumerate(self._units(cfg)):
            masks.update(prefix_masks(f"units.{i}", unit.parameter_masks(depth, kernels, expands, hw)))
            if hw is not None:
                hw = unit.macs(depth, kernels, expands, hw)[1]
        return masks

    def num_parameters(self, cfg: SubnetConfig | None = None) -> int:
        """Parameters of the exported sub-network ``cfg`` (kernel transformations folded in)."""
        return sum(p.numel() for p in self.export(cfg).parameters())

    # ---- channel sorting ------------------------------------------------------------------------
    def sort_channels(
        self, protected_expand_ratios: Sequence[float] = (), optimizer: torch.optim.Optimizer | None = None
    ) -> list[Permutation]:
        """Sort every block's middle channels by importance (see
        :meth:`supernet.elastic.blocks.ElasticMBConv.sort_channels`).

        Deterministic; the optimizer's momentum / moment buffers are permuted alongside so training
        continues consistently. Returns the permutations applied.
        """
        record: list[Permutation] = []
        for unit in self.units:
            record.extend(unit.sort_channels(protected_expand_ratios))
        if optimizer is not None:
            permute_optimizer_state(optimizer, record)
        return record
