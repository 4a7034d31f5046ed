"""Image transforms for the classification tasks: deterministic per-sample ones for the datasets
(``torchvision.transforms.v2`` for PIL images; a plain torch normalisation for tensors), and the
random training augmentation each task applies batch-wise.

The datasets' transforms have no randomness, so a sample is the same whoever loads it and whenever;
training augmentation is a :class:`tasks.augmentation.ImageAugmentation` (``Task.augmentation``),
drawn from the explicit generator of the computation that forms the batch (see that module for why).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from tasks.augmentation import ImageAugmentation, normalised_black

if TYPE_CHECKING:
    from torchvision.transforms import v2

__all__ = [
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "Normalize",
    "tensor_image_transform",
    "pil_image_transform",
    "affine_jitter",
    "crop_and_flip",
]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class Normalize:
    """``(image - mean) / std`` per channel of a float C×H×W tensor, as ``v2.Normalize`` computes it
    (the same operations in the same order, so the same bits).

    Plain torch, so a tensor dataset needs no torchvision: importing it costs seconds of CPU (it
    loads ``torch._dynamo``), which every peer agent would pay at start only to build the digits task."""

    def __init__(self, mean: Sequence[float], std: Sequence[float]):
        if len(mean) != len(std) or any(s == 0 for s in std):
            raise ValueError(f"std: {list(std)} must match mean {list(mean)} and have no zero")
        self.mean = [float(m) for m in mean]  # as v2.Normalize keeps them (exports read them)
        self.std = [float(s) for s in std]
        self._mean = torch.tensor(self.mean, dtype=torch.float32).view(-1, 1, 1)
        self._std = torch.tensor(self.std, dtype=torch.float32).view(-1, 1, 1)

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        return image.sub(self._mean).div_(self._std)

    def __repr__(self) -> str:
        return f"Normalize(mean={self.mean}, std={self.std})"


def tensor_image_transform(mean: Sequence[float], std: Sequence[float]) -> Normalize:
    """For float C×H×W tensors in [0, 1] (digits): normalise."""
    return Normalize(mean, std)


def pil_image_transform(
    image_size: int, mean: Sequence[float], std: Sequence[float], *, grayscale: bool = False
) -> v2.Transform:
    """For PIL images (image folders, CIFAR): resize to ``image_size``, to float, normalise."""
    from torchvision.transforms import v2  # only the file-based tasks need it (see Normalize)

    steps: list[v2.Transform] = [v2.ToImage()]
    if grayscale:
        steps.append(v2.Grayscale(1))
    steps.append(v2.Resize((image_size, image_size), antialias=True))
    steps += [v2.ToDtype(torch.float32, scale=True), v2.Normalize(list(mean), list(std))]
    return v2.Compose(steps)


def affine_jitter(mean: Sequence[float], std: Sequence[float]) -> ImageAugmentation:
    """Small random affine jitter of normalised images (rotation ±10°, translation ±10 %, scale
    0.9–1.1, black outside): what digits trains with."""
    return ImageAugmentation(degrees=10.0, translate=0.1, scale=(0.9, 1.1), fill=normalised_black(mean, std))


def crop_and_flip(image_size: int, hflip: bool = False, crop_padding: int | None = None) -> ImageAugmentation:
    """A random crop from the image reflect-padded by ``crop_padding`` pixels (default ``size/8``) and,
    if ``hflip``, a horizontal flip with probability 1/2: what image folders and CIFAR train with."""
    padding = max(1, image_size // 8) if crop_padding is None else crop_padding
    return ImageAugmentation(crop_padding=padding, hflip=0.5 if hflip else 0.0)
