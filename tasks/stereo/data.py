"""Stereo samples from disk, ground-truth validity, and padding to the network stride.

A sample is a dict of tensors: ``left`` and ``right`` (3×H×W float32 in [0, 1]), ``disparity``
(1×H×W float32, left-referenced, pixels) and ``valid`` (1×H×W bool).

**Invalid ground truth (documented handling).** A ground-truth pixel is valid when it is finite and
non-negative (and ≤ ``max_disparity`` when one is given); NaN, ±inf and negative values — Middlebury
stores ``inf`` for unknown pixels, KITTI stores 0 — are masked out, never fed to the loss. A file in
which *no* pixel is valid is an error naming the file (most likely a wrong sign convention or a wrong
file).

**Sizes.** Left and right must have the same size (else ``ValueError`` naming both files or, in the
model, both shapes). Sizes the network's stride does not divide are padded by :func:`pad_to_multiple`
(replicating the border, at the bottom and the right, so pixel coordinates and disparities are
unchanged) and the prediction is cropped back by :func:`unpad`; ``StereoSupernet`` itself rejects such
sizes with a ``ValueError`` that points here (``supernet.stereo.layout.check_stereo_input``).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from tasks.stereo.io import read_image, read_kitti_disparity, read_pfm

__all__ = [
    "valid_disparity",
    "pad_to_multiple",
    "unpad",
    "predict_disparity",
    "StereoFolder",
    "IMAGE_EXTENSIONS",
]

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".ppm", ".bmp", ".tif", ".tiff", ".webp")


def valid_disparity(disparity: torch.Tensor | np.ndarray, max_disparity: float | None = None):
    """The valid-pixel mask of a ground-truth disparity: finite, ≥ 0, and ≤ max_disparity if given."""
    if isinstance(disparity, np.ndarray):
        with np.errstate(invalid="ignore"):
            mask = np.isfinite(disparity) & (disparity >= 0)
            if max_disparity is not None:
                mask &= disparity <= max_disparity
        return mask
    mask = torch.isfinite(disparity) & (disparity >= 0)
    if max_disparity is not None:
        mask &= disparity <= max_disparity
    return mask


def pad_to_multiple(*images: torch.Tensor, multiple: int) -> tuple[list[torch.Tensor], tuple[int, int]]:
    """Pad B×C×H×W tensors at the bottom and right (border replicated) so H and W divide by ``multiple``.

    Returns the padded tensors and the original (H, W), for :func:`unpad`.
    """
    height, width = images[0].shape[-2:]
    pad_h, pad_w = (-height) % multiple, (-width) % multiple
    if pad_h == 0 and pad_w == 0:
        return list(images), (height, width)
    return [F.pad(x, (0, pad_w, 0, pad_h), mode="replicate") for x in images], (height, width)


def unpad(x: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """Crop a prediction made on padded inputs back to the original (H, W)."""
    return x[..., : size[0], : size[1]]


@torch.no_grad()
def predict_disparity(model, left: torch.Tensor, right: torch.Tensor, stride: int = 64) -> torch.Tensor:
    """The finest disparity of ``model`` (a stereo supernet in eval mode, or an exported sub-network)
    for a pair of any equal size: pads both to a multiple of ``stride``, runs, and crops back.
    Accepts single images (3×H×W) or batches (B×3×H×W)."""
    if left.dim() == 3 and right.dim() == 3:
        return predict_disparity(model, left[None], right[None], stride)[0]
    if left.shape != right.shape:
        raise ValueError(
            f"left and right images differ in size: left {tuple(left.shape)}, right {tuple(right.shape)}"
        )
    (left, right), size = pad_to_multiple(left, right, multiple=stride)
    out = model(left, right)
    return unpad(out[-1] if isinstance(out, list) else out, size)


def _read_disparity(path: Path) -> tuple[np.ndarray, np.ndarray]:
    if path.suffix.lower() == ".pfm":
        disparity = read_pfm(path)
        if disparity.ndim == 3:  # some tools write disparity as a 3-channel PFM; the first is the value
            disparity = disparity[..., 0]
        return disparity, valid_disparity(disparity)
    disparity, valid = read_kitti_disparity(path)
    return disparity, valid


class StereoFolder(Dataset):
    """Stereo pairs with ground truth in a directory, in one of two layouts:

    * ``"kitti"`` (KITTI 2015 ``training/``): ``image_2/*_10.png`` (left), ``image_3/*_10.png``
      (right), ``disp_occ_0/*_10.png`` (16-bit disparity; ``disp_dir="disp_noc_0"`` for the
      non-occluded one);
    * ``"folders"``: ``left/``, ``right/`` and ``disparity/`` holding files with the same stem; the
      disparity is a PFM (Scene Flow, Middlebury) or a KITTI-style 16-bit PNG.

    ``layout="auto"`` picks ``kitti`` when ``image_2/`` exists. ``max_disparity`` additionally masks
    out larger ground truth (as Scene Flow evaluations do with 192). ``transform`` is applied to each
    sample dict (e.g. a crop).
    """

    def __init__(
        self,
        root: str | os.PathLike,
        layout: str = "auto",
        disp_dir: str | None = None,
        max_disparity: float | None = None,
        transform=None,
    ):
        self.root = Path(root)
        if not self.root.is_dir():
            raise ValueError(f"stereo data directory {self.root} does not exist")
        if layout == "auto":
            layout = "kitti" if (self.root / "image_2").is_dir() else "folders"
        if layout == "kitti":
            dirs = ("image_2", "image_3", disp_dir or "disp_occ_0")
            pattern = "*_10.png"
            expected = f"{self.root}/image_2/*_10.png, image_3/*_10.png, {dirs[2]}/*_10.png"
        elif layout == "folders":
            dirs = ("left", "right", disp_dir or "disparity")
            pattern = "*"
            expected = f"{self.root}/left/, right/, {dirs[2]}/ with files of the same stem"
        else:
            raise ValueError(f"layout must be 'auto', 'kitti' or 'folders', got {layout!r}")
        missing = [d for d in dirs if not (self.root / d).is_dir()]
        if missing:
            raise ValueError(
                f"stereo data in {self.root}: missing {', '.join(missing)}/ (expected {expected})"
            )
        left_dir, right_dir, gt_dir = (self.root / d for d in dirs)

        def by_stem(directory: Path, extensions) -> dict[str, Path]:
            return {
                p.stem: p
                for p in sorted(directory.glob(pattern))
                if p.is_file() and p.suffix.lower() in extensions
            }

        lefts = by_stem(left_dir, IMAGE_EXTENSIONS)
        rights = by_stem(right_dir, IMAGE_EXTENSIONS)
        gts = by_stem(gt_dir, (".pfm", ".png"))
        stems = sorted(set(lefts) & set(rights) & set(gts))
        if not stems:
            raise ValueError(
                f"stereo data in {self.root}: no complete left/right/disparity triple (expected {expected})"
            )
        self.samples = [(lefts[s], rights[s], gts[s]) for s in stems]
        self.layout, self.max_disparity, self.transform = layout, max_disparity, transform

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        left_path, right_path, gt_path = self.samples[index]
        left, right = read_image(left_path), read_image(right_path)
        if left.shape != right.shape:
            raise ValueError(
                f"{left_path} is {left.shape[1]}x{left.shape[0]} but {right_path} is "
                f"{right.shape[1]}x{right.shape[0]}: left and right must have the same size"
            )
        disparity, valid = _read_disparity(gt_path)
        if disparity.shape != left.shape[:2]:
            raise ValueError(
                f"{gt_path} is {disparity.shape[1]}x{disparity.shape[0]} but {left_path} is "
                f"{left.shape[1]}x{left.shape[0]}"
            )
        valid = valid & valid_disparity(disparity, self.max_disparity)
        if not valid.any():
            raise ValueError(f"{gt_path}: no valid disparity (all NaN, infinite, negative or out of range)")
        sample = {
            "left": torch.from_numpy(left).permute(2, 0, 1).contiguous(),
            "right": torch.from_numpy(right).permute(2, 0, 1).contiguous(),
            "disparity": torch.from_numpy(np.where(valid, disparity, 0.0).astype(np.float32))[None],
            "valid": torch.from_numpy(valid)[None],
        }
        return self.transform(sample) if self.transform is not None else sample
