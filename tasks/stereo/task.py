"""The built-in ``stereo-synthetic`` task: procedural stereo pairs (no download), multi-scale loss, EPE.

``get_task("stereo-synthetic", height=64, width=128, max_disparity=24, train_size=20000, val_size=64,
seed=0)``. Samples are dicts (``left``, ``right``, ``disparity``, ``valid``; ``default_collate`` stacks
them). The training and validation pairs come from disjoint seeds. ``task.loss(outputs, batch)`` is the
multi-scale loss of the model's output (the list of predictions in training mode, or one tensor) against
``batch["disparity"]`` over ``batch["valid"]``; ``task.metric(outputs, batch)`` is the EPE of the finest
prediction (lower is better; a pixel-weighted mean over batches is the dataset EPE).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from tasks.registry import Task, register_task
from tasks.stereo.metrics import DEFAULT_SCALE_WEIGHTS, MultiScaleLoss, stereo_metrics
from tasks.stereo.synthetic import SyntheticStereo

__all__ = ["stereo_loss", "epe_metric", "stereo_synthetic_task"]


def stereo_loss(weights: Sequence[float] = DEFAULT_SCALE_WEIGHTS, kind: str = "smooth_l1"):
    """``loss(outputs, batch)``: :class:`MultiScaleLoss` against the batch's disparity and valid mask."""
    multiscale = MultiScaleLoss(weights, kind)

    def loss(outputs, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        return multiscale(outputs, batch["disparity"], batch["valid"])

    loss.multiscale = multiscale  # the underlying loss (weights, per-scale values)
    return loss


def epe_metric(outputs, batch: Mapping[str, torch.Tensor]) -> float:
    """End-point error of the finest prediction over the batch's valid pixels."""
    finest = outputs[-1] if isinstance(outputs, (list, tuple)) else outputs
    return stereo_metrics(finest, batch["disparity"], batch["valid"])["epe"]


@register_task("stereo-synthetic")
def stereo_synthetic_task(
    data_dir: str | None = None,
    height: int = 64,
    width: int = 128,
    max_disparity: float = 24.0,
    train_size: int = 20000,
    val_size: int = 64,
    seed: int = 0,
    loss_kind: str = "smooth_l1",
) -> Task:
    options = {
        "height": height,
        "width": width,
        "max_disparity": max_disparity,
        "train_size": train_size,
        "val_size": val_size,
        "seed": seed,
        "loss_kind": loss_kind,
    }
    return Task(
        name="stereo-synthetic",
        num_classes=None,
        input_size=(3, height, width),
        train_set=SyntheticStereo(train_size, height, width, max_disparity, seed=2 * seed),
        val_set=SyntheticStereo(val_size, height, width, max_disparity, seed=2 * seed + 1, cache=True),
        loss=stereo_loss(kind=loss_kind),
        metric=epe_metric,
        metric_name="epe",
        higher_is_better=False,
        options=options,
    )
