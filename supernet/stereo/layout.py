"""The stereo network's fixed layout (units, stride, input normalisation) and the inputs it accepts."""

from __future__ import annotations

import torch

__all__ = ["NUM_UNITS", "ENCODER_UNITS", "STRIDE", "INPUT_MEAN", "INPUT_STD", "check_stereo_input"]

NUM_UNITS = 6
ENCODER_UNITS = 3
STRIDE = 2**NUM_UNITS
# Input normalisation (images in [0, 1]); fixed, and part of the exported model.
INPUT_MEAN, INPUT_STD = 0.45, 0.225


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
