"""The stereo decoder: the fixed U-shaped head that turns features into 7 disparity predictions."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from supernet.stereo.layout import NUM_UNITS

__all__ = ["StereoDecoder"]


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
