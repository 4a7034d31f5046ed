"""``digits``: scikit-learn's bundled handwritten digits (1,797 8×8 grey images, 10 classes).

Real data that ships inside the scikit-learn wheel, so it needs no download. Images are scaled to
[0, 1] and resized (bilinear, antialiased) to ``image_size``×``image_size`` once; the train /
validation split is stratified and fixed by ``split_seed`` (default 0: 1,437 train, 360 validation).
Training batches get a small random affine jitter (``augment``; ``Task.augmentation``).
"""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import Dataset
from torchvision import tv_tensors
from torchvision.transforms import v2

from tasks.registry import Task, classification_loss, register_task
from tasks.transforms import affine_jitter, tensor_image_transform

__all__ = ["TensorImageDataset", "digits_task", "stratified_split"]


class TensorImageDataset(Dataset):
    """Images held in one N×C×H×W float tensor, labels in an N tensor, a deterministic v2 transform
    per item (random augmentation is applied to batches: ``Task.augmentation``)."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, transform: v2.Transform | None = None):
        if len(images) != len(labels):
            raise ValueError(f"labels: {len(labels)} labels for {len(images)} images")
        self.images = images
        self.labels = labels
        self.transform = transform

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        image = tv_tensors.Image(self.images[index])
        if self.transform is not None:
            image = self.transform(image)
        return image.as_subclass(torch.Tensor), int(self.labels[index])


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
    from sklearn.datasets import load_digits

    data = load_digits()
    labels = np.asarray(data.target, dtype=np.int64)
    images = torch.from_numpy(np.asarray(data.images, dtype=np.float32) / 16.0).unsqueeze(1)
    images = v2.functional.resize(images, [image_size, image_size], antialias=True).clamp_(0.0, 1.0)
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
