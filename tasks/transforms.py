"""Image transforms (``torchvision.transforms.v2``) for the classification tasks."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torchvision.transforms import v2

__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "tensor_image_transform", "pil_image_transform"]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def tensor_image_transform(
    train: bool, mean: Sequence[float], std: Sequence[float], augment: bool = True
) -> v2.Transform:
    """For float C×H×W tensors in [0, 1] (digits): small random affine jitter when training, then normalise."""
    steps: list[v2.Transform] = []
    if train and augment:
        steps.append(v2.RandomAffine(degrees=10, translate=(0.1, 0.1), scale=(0.9, 1.1)))
    steps.append(v2.Normalize(list(mean), list(std)))
    return v2.Compose(steps)


def pil_image_transform(
    train: bool,
    image_size: int,
    mean: Sequence[float],
    std: Sequence[float],
    *,
    augment: bool = True,
    hflip: bool = False,
    grayscale: bool = False,
    crop_padding: int | None = None,
) -> v2.Transform:
    """For PIL images (image folders, CIFAR): resize (or pad-and-crop) to ``image_size``, to float, normalise.

    Training augmentation: a random crop (from a ``crop_padding``-padded image, default ``size/8``) and,
    if ``hflip``, a random horizontal flip.
    """
    steps: list[v2.Transform] = [v2.ToImage()]
    if grayscale:
        steps.append(v2.Grayscale(1))
    steps.append(v2.Resize((image_size, image_size), antialias=True))
    if train and augment:
        padding = max(1, image_size // 8) if crop_padding is None else crop_padding
        steps.append(v2.RandomCrop(image_size, padding=padding, padding_mode="reflect"))
        if hflip:
            steps.append(v2.RandomHorizontalFlip())
    steps += [v2.ToDtype(torch.float32, scale=True), v2.Normalize(list(mean), list(std))]
    return v2.Compose(steps)
