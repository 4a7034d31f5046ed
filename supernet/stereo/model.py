"""The stereo once-for-all supernet, :class:`StereoSupernet` (layout: see :mod:`supernet.stereo`)."""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence

import torch
from torch import nn

from supernet.bn import recalibrate_bn
from supernet.config import RandomLike, SearchSpace, SubnetConfig, make_rng
from supernet.elastic.blocks import ElasticUnit
from supernet.elastic.conv import ElasticConv2d
from supernet.elastic.masks import Masks, full_masks, prefix_masks
from supernet.elastic.permutation import Permutation, permute_optimizer_state
from supernet.export import make_activation
from supernet.init import torch_default_
from supernet.stereo.correlation import correlation_1d, with_cost
from supernet.stereo.decoder import StereoDecoder
from supernet.stereo.layout import ENCODER_UNITS, INPUT_MEAN, INPUT_STD, NUM_UNITS, STRIDE, check_stereo_input
from supernet.stereo.static import StaticStereo

__all__ = ["StereoSupernet"]


def _conv_bn_act(cin: int, cout: int, kernel: int, activation: str) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cout, kernel, padding=kernel // 2, bias=False),
        nn.BatchNorm2d(cout),
        make_activation(activation),
    )


class StereoSupernet(nn.Module):
    """Once-for-all stereo supernet; see :mod:`supernet.stereo` for the layout.

    ``space`` — the elastic choices (``num_units`` must be 6; default kernel {3, 5, 7}, expand ratio
    {3, 4, 6}, depth {2, 3, 4}); ``widths`` — output channels of the 6 units; ``stem_channels``;
    ``max_displacement`` — D of the correlation at 1/8 resolution (disparities up to 8·D input pixels
    are in its range; the default 8 covers 64 px); ``fine_correlation`` — also correlate the 1/4
    features (over 2·D) for the decoder; ``redir_channels`` — width of the left features
    joined with the cost; ``decoder_channels`` — widths of the 6 decoder stages (default: the skip
    widths mirrored); ``disparity_scale`` — the head predicts disparity / scale (default 8·D).
    """

    def __init__(
        self,
        space: SearchSpace | None = None,
        *,
        widths: Sequence[int] = (24, 32, 48, 64, 96, 128),
        stem_channels: int = 16,
        max_displacement: int = 8,
        fine_correlation: bool = True,
        redir_channels: int | None = None,
        decoder_channels: Sequence[int] | None = None,
        disparity_scale: float | None = None,
        activation: str = "relu",
        channel_divisor: int = 8,
        kernel_transform: bool = True,
    ):
        super().__init__()
        self.space = SearchSpace(num_units=NUM_UNITS) if space is None else space
        if self.space.num_units != NUM_UNITS:
            raise ValueError(
                f"num_units: the stereo supernet has {NUM_UNITS} units, got {self.space.num_units}"
            )
        widths = tuple(int(w) for w in widths)
        if len(widths) != NUM_UNITS or min(widths) < 1:
            raise ValueError(f"widths: need {NUM_UNITS} positive unit widths, got {widths}")
        if int(max_displacement) < 1:
            raise ValueError(f"max_displacement: need at least 1, got {max_displacement}")
        self.widths = widths
        self.stem_channels = int(stem_channels)
        self.max_displacement = int(max_displacement)
        self.fine_displacement = 2 * self.max_displacement if fine_correlation else 0
        self.redir_channels = int(redir_channels) if redir_channels is not None else max(8, widths[2] // 2)
        self.disparity_scale = (
            float(disparity_scale) if disparity_scale is not None else 8.0 * max_displacement
        )
        self.stride = STRIDE
        cost_channels = self.max_displacement + 1 + self.redir_channels
        fine_channels = widths[1] + (self.fine_displacement + 1 if self.fine_displacement else 0)
        skips = (widths[4], widths[3], cost_channels, fine_channels, widths[0], self.stem_channels)
        decoder_channels = tuple(decoder_channels) if decoder_channels is not None else skips
        self.decoder_channels = tuple(int(c) for c in decoder_channels)

        self.stem = _conv_bn_act(3, self.stem_channels, 3, activation)
        block_options = dict(
            channel_divisor=channel_divisor, activation=activation, kernel_transform=kernel_transform
        )
        inputs = (self.stem_channels, widths[0], widths[1], cost_channels, widths[3], widths[4])
        self.units = nn.ModuleList(
            ElasticUnit(
                cin,
                cout,
                2,
                self.space.kernel_sizes,
                self.space.expand_ratios,
                self.space.depths,
                **block_options,
            )
            for cin, cout in zip(inputs, widths, strict=True)
        )
        self.redir = _conv_bn_act(widths[2], self.redir_channels, 1, activation)
        self.decoder = StereoDecoder(widths[5], skips, self.decoder_channels, self.disparity_scale)
        self.active = self.space.largest()

    @torch.no_grad()
    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        """The initial weights, drawn from ``generator`` (``None``: torch's global one; see
        :mod:`supernet.init` for why :func:`supernet.stereo_training.build_stereo_supernet` passes one).

        The elastic convolutions He-normal (fan-out) with identity kernel transformations, batch
        norms scale 1 (0 for the last BN of residual blocks) and shift 0, the plain convolutions of
        stem, redirection and decoder torch's defaults; in registration order, so the same generator
        state always gives the same weights."""
        for m in self.modules():
            if isinstance(m, ElasticConv2d):
                m.reset_parameters(generator)
            elif isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.reset_parameters()
            elif isinstance(m, (nn.modules.conv._ConvNd, nn.Linear)):
                torch_default_(m, generator)

    # ---- configs ----------------------------------------------------------------------------------
    def sample_config(self, rng: RandomLike) -> SubnetConfig:
        return self.space.sample(make_rng(rng))

    def largest_config(self) -> SubnetConfig:
        return self.space.largest()

    def smallest_config(self) -> SubnetConfig:
        return self.space.smallest()

    def set_active(self, cfg: SubnetConfig) -> StereoSupernet:
        self.active = self.space.validate(cfg)
        return self

    def _unit_args(self, cfg: SubnetConfig, u: int):
        return cfg.depths[u], cfg.kernel_sizes[u], cfg.expand_ratios[u]

    # ---- forward ----------------------------------------------------------------------------------
    def multiscale(self, left: torch.Tensor, right: torch.Tensor) -> list[torch.Tensor]:
        """The 7 predictions (coarse → fine) of the active sub-network, in any mode."""
        check_stereo_input(left, right, self.stride)
        if (
            self.training
            and left.shape[0] * (left.shape[2] // self.stride) * (left.shape[3] // self.stride) < 2
        ):
            raise ValueError(
                f"a training batch of {left.shape[0]} pair(s) of {left.shape[2]}x{left.shape[3]} leaves one value "
                "per channel at 1/64 resolution, too few for batch norm: use a larger batch or larger images"
            )
        cfg = self.active
        batch = left.shape[0]
        x = self.stem((torch.cat([left, right], 0) - INPUT_MEAN) / INPUT_STD)
        skips = [x[:batch]]
        for u in range(ENCODER_UNITS):
            x = self.units[u](x, *self._unit_args(cfg, u))
            if u == 1 and self.fine_displacement > 0:
                skips.append(with_cost(x, batch, self.fine_displacement))
            else:
                skips.append(x[:batch])
        features = skips.pop()
        x = torch.cat([correlation_1d(features, x[batch:], self.max_displacement), self.redir(features)], 1)
        for u in range(ENCODER_UNITS, NUM_UNITS):
            skips.append(x)
            x = self.units[u](x, *self._unit_args(cfg, u))
        skips.reverse()
        return self.decoder(x, skips)

    def forward(self, left: torch.Tensor, right: torch.Tensor):
        """Training mode: the list of 7 predictions coarse → fine; eval mode: the finest, B×1×H×W."""
        predictions = self.multiscale(left, right)
        return predictions if self.training else predictions[-1]

    # ---- export, masks, FLOPs ------------------------------------------------------------------------
    @torch.no_grad()
    def export(self, cfg: SubnetConfig | None = None) -> StaticStereo:
        """A standalone plain-torch copy of sub-network ``cfg`` (default: the active one), in eval mode.

        Weights are copied (kernel transformations applied), BN running statistics included, so
        recalibrate BN for ``cfg`` first (:meth:`recalibrate_bn`). Save it with
        ``supernet.save_torchscript``; ``torch.jit.load`` then needs no MANTA code.
        """

        cfg = self.active if cfg is None else self.space.validate(cfg)
        units = nn.ModuleList(self.units[u].export(*self._unit_args(cfg, u)) for u in range(NUM_UNITS))
        model = StaticStereo(
            copy.deepcopy(self.stem),
            units,
            copy.deepcopy(self.redir),
            copy.deepcopy(self.decoder),
            self.max_displacement,
            self.fine_displacement,
        )
        for p in model.parameters():
            p.requires_grad_(True)
        return model.eval()

    def parameter_masks(
        self, cfg: SubnetConfig | None = None, input_size: Sequence[int] | None = None
    ) -> Masks:
        """For every entry of ``named_parameters()``, a bool tensor of the elements ``cfg`` uses.

        The contract of ``ClassificationSupernet.parameter_masks``: fixed layers (stem, redirection,
        decoder) are fully used, blocks beyond a unit's depth not at all, inside a block the active
        middle channels, kernel region and kernel-transformation rows. With ``input_size`` (H, W) the
        masks are exact for that size (depthwise taps that only meet zero padding on maps smaller
        than the kernel are left out).
        """
        cfg = self.active if cfg is None else self.space.validate(cfg)
        hw = None if input_size is None else self._size(input_size)
        masks = full_masks(self, True)
        for u in range(NUM_UNITS):
            args = self._unit_args(cfg, u)
            masks.update(prefix_masks(f"units.{u}", self.units[u].parameter_masks(*args, hw)))
            if hw is not None:
                hw = self.units[u].macs(*args, hw)[1]
        return masks

    def _size(self, input_size: int | Sequence[int]) -> tuple[int, int]:
        size = (input_size, input_size) if isinstance(input_size, int) else tuple(int(s) for s in input_size)
        if len(size) == 3 and size[0] == 3:
            size = size[1:]
        if len(size) != 2 or size[0] % self.stride or size[1] % self.stride or min(size) < 1:
            raise ValueError(
                f"input_size: expected (H, W) or (3, H, W), multiples of the stride {self.stride}, got {input_size}"
            )
        return size

    def flops(self, cfg: SubnetConfig | None = None, input_size: int | Sequence[int] = (64, 128)) -> int:
        """Multiply-adds of one forward pass on one stereo pair of ``input_size`` ((H, W), (3, H, W) or H = W).

        Counts every convolution, transposed convolution and the correlation's matrix product (as
        computed: H·W²·C at 1/8 resolution); normalisation, activations, up-sampling and the
        correlation's gather are not counted. Equals ``torch.utils.flop_counter`` / 2 on the export.
        """
        cfg = self.active if cfg is None else self.space.validate(cfg)
        height, width = self._size(input_size)
        total = 2 * 3 * self.stem_channels * 9 * height * width
        hw = (height, width)
        sizes = [hw]
        for u in range(NUM_UNITS):
            macs, hw = self.units[u].macs(*self._unit_args(cfg, u), hw)
            total += macs * (2 if u < ENCODER_UNITS else 1)
            sizes.append(hw)
            if u == ENCODER_UNITS - 1:
                h8, w8 = hw
                total += h8 * w8 * w8 * self.widths[2]  # correlation: all pairs per row
                total += self.widths[2] * self.redir_channels * h8 * w8
            if u == 1 and self.fine_displacement:
                h4, w4 = hw
                total += h4 * w4 * w4 * self.widths[1]  # the fine correlation at 1/4
        # decoder: pr6, then per stage a 4×4 transposed conv, the 3×3 fuse conv and the 3×3 prediction
        h, w = sizes[-1]
        total += self.widths[5] * 9 * h * w
        cin = self.widths[5]
        for fuse, width_ in zip(self.decoder.fuses, self.decoder_channels, strict=True):
            total += cin * width_ * 16 * h * w
            h, w = 2 * h, 2 * w
            total += (fuse[0].in_channels * width_ + width_) * 9 * h * w
            cin = width_
        return int(total)

    def num_parameters(self, cfg: SubnetConfig | None = None) -> int:
        """Parameters of the exported sub-network ``cfg`` (kernel transformations folded in)."""
        return sum(p.numel() for p in self.export(cfg).parameters())

    # ---- batch norm and channel sorting ----------------------------------------------------------------
    def recalibrate_bn(self, cfg: SubnetConfig | None, batches: Iterable, num_batches: int) -> StereoSupernet:
        """Recompute BN running statistics for ``cfg`` from ``num_batches`` stereo batches (dicts with
        ``left`` and ``right``, as the stereo data sets give), through :func:`supernet.recalibrate_bn`."""
        pairs = (torch.stack([batch["left"], batch["right"]]) for batch in batches)
        recalibrate_bn(_PairInput(self), cfg, pairs, num_batches)
        return self

    def sort_channels(
        self, protected_expand_ratios: Sequence[float] = (), optimizer: torch.optim.Optimizer | None = None
    ) -> list[Permutation]:
        """Sort every block's middle channels by importance (as ``ClassificationSupernet.sort_channels``)."""
        record: list[Permutation] = []
        for unit in self.units:
            record.extend(unit.sort_channels(protected_expand_ratios))
        if optimizer is not None:
            permute_optimizer_state(optimizer, record)
        return record


class _PairInput(nn.Module):
    """Presents a stereo net as a one-input net (a stacked 2×B×3×H×W pair) to :func:`recalibrate_bn`."""

    def __init__(self, net: StereoSupernet):
        super().__init__()
        self.net = net

    def set_active(self, cfg: SubnetConfig) -> None:
        self.net.set_active(cfg)

    def forward(self, pair: torch.Tensor):
        return self.net(pair[0], pair[1])
