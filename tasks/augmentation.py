"""Random training augmentation of whole batches, drawn from an explicit ``torch.Generator``.

Datasets give deterministic samples (resized, normalised: what validation sees); the random part of
training augmentation is applied where a training batch is formed, with the generator of that
computation (:func:`supernet.training.batches.training_batch`, BN recalibration). Why not torchvision's
random transforms inside ``Dataset.__getitem__``: they draw from torch's global generator, which all
threads of a process share, so a spot audit replaying a peer's augmentation in one thread of the
aggregator would see the draws of another thread. Here the draws depend only on the generator's seed
and the batch.

:class:`ImageAugmentation` does what torchvision's ``RandomAffine``, ``RandomCrop(padding,
padding_mode="reflect")`` and ``RandomHorizontalFlip`` do, with the same parameter distributions (not
the same draws), on normalised images: crops and flips only move pixels,
so they commute with the per-channel normalisation, and the affine warp fills uncovered pixels with
``fill``, the normalised value of black.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F

__all__ = ["Augmentation", "ImageAugmentation", "normalised_black"]


class Augmentation(Protocol):
    """What :class:`tasks.registry.Task` ``augmentation`` is: a batch of training inputs in, the
    augmented batch out, every random choice drawn from ``generator``."""

    def __call__(self, inputs: torch.Tensor, generator: torch.Generator) -> torch.Tensor: ...


def _uniform(count: int, low: float, high: float, generator: torch.Generator) -> list[float]:
    return (low + (high - low) * torch.rand(count, generator=generator, dtype=torch.float64)).tolist()


def normalised_black(mean: Sequence[float], std: Sequence[float]) -> tuple[float, ...]:
    """The value per channel that 0 (black) becomes after ``Normalize(mean, std)``."""
    return tuple(-m / s for m, s in zip(mean, std, strict=True))


@dataclass(frozen=True)
class ImageAugmentation:
    """Per-sample random augmentation of a B×C×H×W batch, in this order:

    * an affine warp (if ``degrees``, ``translate`` or ``scale`` ask for one): rotation uniform in
      ``±degrees``, translation by a whole number of pixels uniform in ``±translate × size``, scale
      uniform in ``scale``; nearest-neighbour, uncovered pixels ``fill`` (one value per channel);
    * a random crop of the original size from the image reflect-padded by ``crop_padding`` pixels;
    * a horizontal flip with probability ``hflip``.

    Draws are made batch-wise from the generator in that order, so the same generator state and the
    same batch always give the same output. Returns a new tensor; the input is not modified.
    """

    degrees: float = 0.0
    translate: float = 0.0
    scale: tuple[float, float] = (1.0, 1.0)
    fill: tuple[float, ...] = (0.0,)
    crop_padding: int = 0
    hflip: float = 0.0

    def __post_init__(self) -> None:
        checks = [
            ("degrees", self.degrees >= 0, "non-negative"),
            ("translate", 0 <= self.translate <= 1, "in [0, 1]"),
            ("scale", len(self.scale) == 2 and 0 < self.scale[0] <= self.scale[1], "a range (low, high) > 0"),
            ("crop_padding", self.crop_padding >= 0, "non-negative"),
            ("hflip", 0 <= self.hflip <= 1, "a probability"),
        ]
        for name, ok, expected in checks:
            if not ok:
                raise ValueError(f"{name}: {getattr(self, name)!r} is not {expected}")

    @property
    def warps(self) -> bool:
        return self.degrees > 0 or self.translate > 0 or tuple(self.scale) != (1.0, 1.0)

    def __call__(self, inputs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        if inputs.dim() != 4:
            raise ValueError(f"inputs: expected a B×C×H×W batch, got shape {tuple(inputs.shape)}")
        out = inputs
        if self.warps:
            out = self._affine(out, generator)
        if self.crop_padding > 0:
            out = self._crop(out, generator)
        if self.hflip > 0:
            out = self._flip(out, generator)
        return out if out is not inputs else inputs.clone()

    def _affine(self, images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """Each output pixel takes the nearest source pixel under the inverse of its image's warp
        (rotation and scale about the centre, then a whole-pixel shift), or ``fill`` from outside.

        The geometry of torchvision's ``affine`` (clockwise angles, pixel centres, nearest with ties
        to even), in plain torch and for the whole batch at once: importing torchvision costs seconds
        of CPU, which every worker, audit and evaluation that warps a batch would pay at start."""
        batch, channels, height, width = images.shape
        angles = _uniform(batch, -self.degrees, self.degrees, generator)
        dx = _uniform(batch, -self.translate * width, self.translate * width, generator)
        dy = _uniform(batch, -self.translate * height, self.translate * height, generator)
        scales = _uniform(batch, self.scale[0], self.scale[1], generator)
        rad = torch.deg2rad(torch.tensor(angles, dtype=torch.float64))[:, None, None]
        cos, sin = torch.cos(rad), torch.sin(rad)
        scale = torch.tensor(scales, dtype=torch.float64)[:, None, None]
        shift_x = torch.tensor([round(x) for x in dx], dtype=torch.float64)[:, None, None]
        shift_y = torch.tensor([round(y) for y in dy], dtype=torch.float64)[:, None, None]
        # output pixel centres relative to the image centre, the shift undone (B×H×W)
        x = torch.arange(width, dtype=torch.float64)[None, None, :] - (width - 1) / 2 - shift_x
        y = torch.arange(height, dtype=torch.float64)[None, :, None] - (height - 1) / 2 - shift_y
        # the rotation and scale undone: source pixel indices
        source_x = torch.round((cos * x + sin * y) / scale + (width - 1) / 2).long()
        source_y = torch.round((cos * y - sin * x) / scale + (height - 1) / 2).long()
        inside = (source_x >= 0) & (source_x < width) & (source_y >= 0) & (source_y < height)
        index = source_y.clamp(0, height - 1) * width + source_x.clamp(0, width - 1)
        index = index.to(images.device).flatten(1)[:, None, :].expand(batch, channels, height * width)
        warped = images.flatten(2).gather(2, index).view(batch, channels, height, width)
        values = list(self.fill) if len(self.fill) == channels else [float(self.fill[0])] * channels
        fill = torch.tensor(values, dtype=images.dtype, device=images.device)[None, :, None, None]
        return torch.where(inside.to(images.device)[:, None], warped, fill)

    def _crop(self, images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        batch, _, height, width = images.shape
        pad = self.crop_padding
        padded = F.pad(images, (pad, pad, pad, pad), mode="reflect")
        offsets = torch.randint(0, 2 * pad + 1, (batch, 2), generator=generator).tolist()
        return torch.stack(
            [image[:, y : y + height, x : x + width] for image, (y, x) in zip(padded, offsets, strict=True)]
        )

    def _flip(self, images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        flip = (torch.rand(images.shape[0], generator=generator) < self.hflip).to(images.device)
        return torch.where(flip[:, None, None, None], images.flip(-1), images)
