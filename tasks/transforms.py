"""Image transforms for the classification tasks: deterministic per-sample ones
(``torchvision.transforms.v2``) for the datasets, and the random training augmentation each task
applies batch-wise.

The datasets' transforms have no randomness, so a sample is the same whoever loads it and whenever;
training augmentation is a :class:`tasks.augmentation.ImageAugmentation` (``Task.augmentation``),
drawn from the explicit generator of the computation that forms the batch (see that module for why).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torchvision.transforms import v2

from tasks.augmentation import ImageAugmentation, normalised_black

__all__ = [
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "tensor_image_transform",
    "pil_image_transform",
    "affine_jitter",
    "crop_and_flip",
]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def tensor_image_transform(mean: Sequence[float], std: Sequence[float]) -> v2.Transform:
    """For float C×H×W tensors in [0, 1] (digits): normalise."""
    return v2.Normalize(list(mean), list(std))


def pil_image_transform(
    image_size: int, mean: Sequence[float], std: Sequence[float], *, grayscale: bool = False
) -> v2.Transform:
    """For PIL images (image folders, CIFAR): resize to ``image_size``, to float, normalise."""
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
