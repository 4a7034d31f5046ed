"""Stereo-depth once-for-all supernet: a DispNetC-like encoder–decoder with a 1-D correlation layer.

Layout (strides relative to the input; every searchable unit halves the resolution)::

    left, right ─ stem (3×3, full res) ─ units[0] ─ units[1] ─ units[2]      siamese: one pass, shared weights
                                          1/2        1/4        1/8
    correlation_1d(left 1/8, right 1/8; d = 0..D)  ⊕  redir(left 1/8)  = cost features (1/8)
    cost ─ units[3] ─ units[4] ─ units[5]                                     1/16, 1/32, 1/64
    decoder: pr6 at 1/64, then 6 × (transposed conv ×2, ⊕ skip, ⊕ ↑previous disparity, 3×3 conv,
    disparity = ↑previous + 3×3 conv) with skips units[4], units[3], cost, units[1] ⊕ fine cost,
    units[0], stem (left features), giving pr5 … pr0 at 1/32 … 1/1.

The fine cost (``fine_correlation=True``, the default) is the same correlation layer applied once more
to the 1/4 features, over 2·D displacements (the same range in pixels); it joins the decoder's 1/4
skip and gives the fine levels a direct matching signal (on ``stereo-synthetic`` it lowered the EPE
after 120 training steps from 3.24 to 2.38 px). It costs H/4·(W/4)²·C multiply-adds.

``net.units`` holds exactly the 6 searchable :class:`~supernet.elastic.ElasticUnit` s (elastic kernel
size, expand ratio and depth, the classification supernet's operations and :class:`SubnetConfig`);
the stem, the redirection conv, the correlation and the decoder are fixed. In training mode the forward
pass returns the 7 predictions coarse → fine; in eval mode only the finest (B×1×H×W). Every prediction
is a left-referenced disparity in **full-resolution pixels** (the head's raw output times
``disparity_scale``), so coarse predictions are compared with the ground truth after plain bilinear
up-sampling (``tasks.stereo.MultiScaleLoss``).

Inputs are two B×3×H×W images in [0, 1] of the same size, H and W multiples of :attr:`stride` (64);
anything else raises ``ValueError`` — pad with ``tasks.stereo.pad_to_multiple`` and crop the result
with ``tasks.stereo.unpad``, or call ``tasks.stereo.predict_disparity``, which does both (for the
supernet and for exported models alike).

The correlation (:func:`correlation_1d`) is the Caffe ``Correlation1D`` with kernel 1, one-sided:
``cost[:, d, y, x] = mean_c left[c, y, x] · right[c, y, x − d]`` for d = 0 … D (0 where x − d < 0). It
is computed as one batched all-pairs matrix product per image row plus a gather of the D + 1 diagonals —
vectorised, no Python loop over displacements.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from supernet.bn import recalibrate_bn
from supernet.config import RandomLike, SearchSpace, SubnetConfig, make_rng
from supernet.elastic.blocks import ElasticUnit
from supernet.elastic.conv import ElasticConv2d
from supernet.elastic.masks import Masks, full_masks, prefix_masks
from supernet.elastic.permutation import Permutation, permute_optimizer_state
from supernet.export import make_activation
from supernet.init import torch_default_

__all__ = [
    "StereoSupernet",
    "StaticStereo",
    "StereoDecoder",
    "correlation_1d",
    "correlation_1d_loop",
    "check_stereo_input",
]

NUM_UNITS = 6
ENCODER_UNITS = 3
STRIDE = 2**NUM_UNITS
# Input normalisation (images in [0, 1]); fixed, and part of the exported model.
_MEAN, _STD = 0.45, 0.225


def correlation_1d(left: torch.Tensor, right: torch.Tensor, max_displacement: int) -> torch.Tensor:
    """One-sided horizontal correlation: B×C×H×W, B×C×H×W → B×(D+1)×H×W.

    ``out[:, d, y, x] = mean_c left[:, c, y, x] * right[:, c, y, x - d]``, zero where ``x - d < 0``.
    All pairs of a row in one matrix product (B·H·W² multiply-adds per channel), then the D + 1
    diagonals are gathered.
    """
    batch, channels, height, width = left.shape
    rows_left = left.permute(0, 2, 3, 1)  # B, H, W, C
    rows_right = right.permute(0, 2, 1, 3)  # B, H, C, W
    pairs = torch.matmul(rows_left, rows_right) / channels  # B, H, W(x), W(x')
    x = torch.arange(width, device=left.device)
    d = torch.arange(max_displacement + 1, device=left.device)
    index = x.unsqueeze(1) - d.unsqueeze(0)  # W, D+1: x - d
    inside = (index >= 0).to(pairs.dtype)
    index = index.clamp(min=0).expand(batch, height, width, max_displacement + 1)
    cost = torch.gather(pairs, 3, index) * inside
    return cost.permute(0, 3, 1, 2).contiguous()


def correlation_1d_loop(left: torch.Tensor, right: torch.Tensor, max_displacement: int) -> torch.Tensor:
    """The same correlation with a Python loop over displacements (reference for tests and benchmarks)."""
    out = left.new_zeros(left.shape[0], max_displacement + 1, *left.shape[2:])
    width = left.shape[-1]
    for d in range(min(max_displacement, width - 1) + 1):
        out[:, d, :, d:] = (left[..., d:] * right[..., : width - d]).mean(1)
    return out


def _with_cost(x: torch.Tensor, batch: int, max_displacement: int) -> torch.Tensor:
    """Left features (the first ``batch`` of a siamese batch) joined with their correlation to the right."""
    left = x[:batch]
    return torch.cat([left, correlation_1d(left, x[batch:], max_displacement)], 1)


def check_stereo_input(left: torch.Tensor, right: torch.Tensor, stride: int = STRIDE) -> None:
    """Raise ``ValueError`` unless left/right are equal-sized B×3×H×W batches with H, W multiples of stride."""
    if not isinstance(left, torch.Tensor) or not isinstance(right, torch.Tensor):
        raise ValueError("left and right must be tensors")
    if left.dim() != 4 or right.dim() != 4:
        raise ValueError(
            f"left and right must be batches B×3×H×W, got {tuple(left.shape)} and {tuple(right.shape)}"
        )
    if left.shape != right.shape:
        raise ValueError(
            f"left and right images differ in size: left {tuple(left.shape)}, right {tuple(right.shape)}"
            " (a rectified pair has equal sizes)"
        )
    if left.shape[1] != 3:
        raise ValueError(f"images must have 3 channels, got {left.shape[1]}")
    height, width = left.shape[-2:]
    if height % stride or width % stride:
        raise ValueError(
            f"image size {height}x{width} is not a multiple of the network stride {stride}: pad it "
            "(tasks.stereo.pad_to_multiple, then unpad the prediction) or use tasks.stereo.predict_disparity"
        )


def _conv_bn_act(cin: int, cout: int, kernel: int, activation: str) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cout, kernel, padding=kernel // 2, bias=False),
        nn.BatchNorm2d(cout),
        make_activation(activation),
    )


def _upsample2(x: torch.Tensor) -> torch.Tensor:
    return F.interpolate(x, scale_factor=2.0, mode="bilinear", align_corners=False)


class StereoDecoder(nn.Module):
    """The fixed U-shaped decoder: ``pr6`` from the bottleneck, then 6 stages of (transposed conv ×2,
    concatenation with the skip and the up-sampled previous disparity, 3×3 conv, residual 3×3
    disparity conv). Plain torch; used as is by the supernet and (copied) by exported models."""

    def __init__(
        self, bottleneck: int, skips: Sequence[int], channels: Sequence[int], disparity_scale: float
    ):
        super().__init__()
        if len(skips) != NUM_UNITS or len(channels) != NUM_UNITS:
            raise ValueError(f"decoder: need {NUM_UNITS} skip widths and {NUM_UNITS} stage widths")
        self.disparity_scale = float(disparity_scale)
        self.predict_coarsest = nn.Conv2d(bottleneck, 1, 3, padding=1)
        self.upconvs = nn.ModuleList()
        self.fuses = nn.ModuleList()
        self.predicts = nn.ModuleList()
        cin = bottleneck
        for skip, width in zip(skips, channels, strict=True):
            self.upconvs.append(
                nn.Sequential(nn.ConvTranspose2d(cin, width, 4, stride=2, padding=1), nn.LeakyReLU(0.1))
            )
            self.fuses.append(
                nn.Sequential(nn.Conv2d(width + skip + 1, width, 3, padding=1), nn.LeakyReLU(0.1))
            )
            self.predicts.append(nn.Conv2d(width, 1, 3, padding=1))
            cin = width

    def forward(self, bottleneck: torch.Tensor, skips: list[torch.Tensor]) -> list[torch.Tensor]:
        """``bottleneck``: the 1/64 features; ``skips``: the 6 skip features coarse → fine (1/32 … 1/1)."""
        disparity = self.predict_coarsest(bottleneck)
        predictions = [disparity * self.disparity_scale]
        x = bottleneck
        i = 0
        for upconv, fuse, predict in zip(self.upconvs, self.fuses, self.predicts):  # noqa: B905 (TorchScript)
            x = upconv(x)
            disparity = _upsample2(disparity)
            x = fuse(torch.cat([x, skips[i], disparity], 1))
            disparity = disparity + predict(x)
            predictions.append(disparity * self.disparity_scale)
            i += 1
        return predictions


class StaticStereo(nn.Module):
    """A deployed stereo sub-network of plain torch layers (TorchScript-able).

    ``encoder`` holds the 3 siamese units, ``aggregation`` the 3 units after the correlation.
    ``forward(left, right)`` returns the finest disparity (B×1×H×W, pixels); ``multiscale(left, right)``
    all 7 predictions coarse → fine (for fine-tuning). Same input rules as the supernet.
    """

    def __init__(
        self,
        stem: nn.Module,
        units: nn.ModuleList,
        redir: nn.Module,
        decoder: StereoDecoder,
        max_displacement: int,
        fine_displacement: int = 0,
    ):
        super().__init__()
        self.stem = stem
        self.encoder = nn.ModuleList(units[:ENCODER_UNITS])
        self.aggregation = nn.ModuleList(units[ENCODER_UNITS:])
        self.redir = redir
        self.decoder = decoder
        self.max_displacement = int(max_displacement)
        self.fine_displacement = int(fine_displacement)
        self.stride = STRIDE
        self.input_mean, self.input_std = _MEAN, _STD

    def _check(self, left: torch.Tensor, right: torch.Tensor) -> None:
        # TorchScript-compatible version of check_stereo_input (raises ValueError the same way).
        if left.dim() != 4 or right.dim() != 4 or left.shape != right.shape or left.shape[1] != 3:
            raise ValueError("left and right must be equal-sized batches B×3×H×W")
        if left.shape[2] % self.stride != 0 or left.shape[3] % self.stride != 0:
            raise ValueError("image height and width must be multiples of the network stride 64 (pad them)")

    @torch.jit.export
    def multiscale(self, left: torch.Tensor, right: torch.Tensor) -> list[torch.Tensor]:
        self._check(left, right)
        batch = left.shape[0]
        x = self.stem((torch.cat([left, right], 0) - self.input_mean) / self.input_std)
        skips = [x[:batch]]
        i = 0
        for unit in self.encoder:
            x = unit(x)
            if i == 1 and self.fine_displacement > 0:
                skips.append(_with_cost(x, batch, self.fine_displacement))
            else:
                skips.append(x[:batch])
            i += 1
        features = skips.pop()
        x = torch.cat([correlation_1d(features, x[batch:], self.max_displacement), self.redir(features)], 1)
        for unit in self.aggregation:
            skips.append(x)
            x = unit(x)
        skips.reverse()
        return self.decoder(x, skips)

    def forward(self, left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
        return self.multiscale(left, right)[-1]


class StereoSupernet(nn.Module):
    """Once-for-all stereo supernet; see the module docstring for the layout.

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
        x = self.stem((torch.cat([left, right], 0) - _MEAN) / _STD)
        skips = [x[:batch]]
        for u in range(ENCODER_UNITS):
            x = self.units[u](x, *self._unit_args(cfg, u))
            if u == 1 and self.fine_displacement > 0:
                skips.append(_with_cost(x, batch, self.fine_displacement))
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
