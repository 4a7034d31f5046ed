"""Stereo depth: disparity file readers, a procedural data set with exact ground truth, a directory
data set, input checks and padding, metrics (EPE, bad-τ, KITTI D1) and the multi-scale loss.

Conventions: disparity is left-referenced, in pixels (``left(x, y) = right(x - d, y)``); a sample is a
dict with ``left``, ``right`` (3×H×W, [0, 1]), ``disparity`` (1×H×W) and ``valid`` (1×H×W bool).
"""

from tasks.stereo.data import (
    IMAGE_EXTENSIONS,
    StereoFolder,
    pad_to_multiple,
    predict_disparity,
    unpad,
    valid_disparity,
)
from tasks.stereo.io import read_image, read_kitti_disparity, read_pfm, write_kitti_disparity, write_pfm
from tasks.stereo.metrics import DEFAULT_SCALE_WEIGHTS, MultiScaleLoss, StereoMetrics, stereo_metrics
from tasks.stereo.synthetic import SyntheticStereo, generate_pair

__all__ = [
    "DEFAULT_SCALE_WEIGHTS",
    "IMAGE_EXTENSIONS",
    "MultiScaleLoss",
    "StereoFolder",
    "StereoMetrics",
    "SyntheticStereo",
    "generate_pair",
    "pad_to_multiple",
    "predict_disparity",
    "read_image",
    "read_kitti_disparity",
    "read_pfm",
    "stereo_metrics",
    "unpad",
    "valid_disparity",
    "write_kitti_disparity",
    "write_pfm",
]
