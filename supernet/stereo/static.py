"""A deployed stereo sub-network: plain torch layers, TorchScript-able, no MANTA code needed to run it."""

from __future__ import annotations

import torch
from torch import nn

from supernet.stereo.correlation import correlation_1d, with_cost
from supernet.stereo.decoder import StereoDecoder
from supernet.stereo.layout import ENCODER_UNITS, INPUT_MEAN, INPUT_STD, STRIDE

__all__ = ["StaticStereo"]


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
        self.input_mean, self.input_std = INPUT_MEAN, INPUT_STD

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
                skips.append(with_cost(x, batch, self.fine_displacement))
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
