"""``digits``: scikit-learn's bundled handwritten digits (1,797 8×8 grey images, 10 classes).

Real data that ships inside the scikit-learn wheel, so it needs no download. Images are scaled to
[0, 1] and resized (bilinear, antialiased) to ``image_size``×``image_size`` once; the train /
validation split is stratified and fixed by ``split_seed`` (default 0: 1,437 train, 360 validation).
Training batches get a small random affine jitter (``augment``; ``Task.augmentation``).

Building the task imports neither scikit-learn nor torchvision: every peer agent, worker, aggregator
and ``manta-swarm`` builds it at start, and importing the two costs seconds of CPU per process
(benchmarks/RESULTS.md, "Start-up").
"""

from __future__ import annotations

import gzip
import importlib.util
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from tasks.registry import Task, classification_loss, register_task
from tasks.transforms import affine_jitter, tensor_image_transform

__all__ = ["TensorImageDataset", "digits_task", "load_digit_arrays", "stratified_split"]


class TensorImageDataset(Dataset):
    """Images held in one N×C×H×W float tensor, labels in an N tensor, a deterministic transform of a
    C×H×W tensor per item (random augmentation is applied to batches: ``Task.augmentation``)."""

    def __init__(
        self,
        images: torch.Tensor,
        labels: torch.Tensor,
        transform: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ):
        if len(images) != len(labels):
            raise ValueError(f"labels: {len(labels)} labels for {len(images)} images")
        self.images = images
        self.labels = labels
        self.transform = transform

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        image = self.images[index]
        if self.transform is not None:
            image = self.transform(image)
        return image, int(self.labels[index])


def _bundled_digits_file() -> Path | None:
    """scikit-learn's ``datasets/data/digits.csv.gz``, found without importing scikit-learn."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "datasets" / "data" / "digits.csv.gz"
    return path if path.is_file() else None


def load_digit_arrays() -> tuple[np.ndarray, np.ndarray]:
    """The 1,797 images (N×8×8, values 0..16) and their labels, as ``sklearn.datasets.load_digits``
    gives them: read from the file it reads, or through it if that file is not where this looks."""
    path = _bundled_digits_file()
    if path is None:
        from sklearn.datasets import load_digits

        data = load_digits()
        return data.images, data.target
    with gzip.open(path, mode="rt", encoding="utf-8") as text:
        rows = np.loadtxt(text, delimiter=",")
    return rows[:, :-1].reshape(-1, 8, 8), rows[:, -1].astype(int)


def stratified_split(labels: np.ndarray, val_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Deterministic stratified split: per class, a seeded permutation; the first share goes to validation."""
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction: {val_fraction} is not between 0 and 1")
    rng = np.random.default_rng(seed)
    train, val = [], []
    for cls in np.unique(labels):
        members = np.flatnonzero(labels == cls)
        members = members[rng.permutation(len(members))]
        n_val = int(round(len(members) * val_fraction))
        val.append(members[:n_val])
        train.append(members[n_val:])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(val))


@register_task("digits")
def digits_task(
    data_dir: str | None = None,
    image_size: int = 32,
    val_fraction: float = 0.2,
    split_seed: int = 0,
    augment: bool = True,
    label_smoothing: float = 0.0,
) -> Task:
    pixels, target = load_digit_arrays()
    labels = np.asarray(target, dtype=np.int64)
    images = torch.from_numpy(np.asarray(pixels, dtype=np.float32) / 16.0).unsqueeze(1)
    # torchvision's resize of a float batch is exactly this call (bilinear, antialiased)
    images = F.interpolate(
        images, size=[image_size, image_size], mode="bilinear", align_corners=False, antialias=True
    ).clamp_(0.0, 1.0)
    train_idx, val_idx = stratified_split(labels, val_fraction, split_seed)
    train_images = images[train_idx]
    mean, std = [train_images.mean().item()], [train_images.std().item()]
    labels_t = torch.from_numpy(labels)
    return Task(
        name="digits",
        num_classes=10,
        input_size=(1, image_size, image_size),
        train_set=TensorImageDataset(train_images, labels_t[train_idx], tensor_image_transform(mean, std)),
        val_set=TensorImageDataset(images[val_idx], labels_t[val_idx], tensor_image_transform(mean, std)),
        augmentation=affine_jitter(mean, std) if augment else None,
        loss=classification_loss(label_smoothing),
        classes=tuple(str(c) for c in range(10)),
        options={"image_size": image_size, "val_fraction": val_fraction, "split_seed": split_seed},
    )
