"""Training batches: samples loaded by index, collated, and augmented from an explicit generator."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from torch.utils.data import Dataset, default_collate

if TYPE_CHECKING:
    from tasks.registry import Task

__all__ = ["batch_for_step", "training_batch"]


def batch_for_step(dataset: Dataset, indices: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Load and collate the samples ``indices`` (e.g. from :func:`tasks.sharding.shard_indices`)."""
    inputs, targets = default_collate([dataset[int(i)] for i in indices])
    return inputs, targets


def training_batch(
    task: Task, indices: Sequence[int], generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """The training samples ``indices`` of ``task``, collated and augmented (``task.augmentation``,
    if any) with draws from ``generator``: the same generator state gives the same batch, whatever
    other threads draw meanwhile."""
    inputs, targets = batch_for_step(task.train_set, indices)
    if task.augmentation is not None:
        inputs = task.augmentation(inputs, generator)
    return inputs, targets
