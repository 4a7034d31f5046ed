"""The built-in ``stereo-folder`` task: a real stereo data set read from local disk.

``get_task("stereo-folder", data_dir, layout="kitti2015", height=None, width=None, val_fraction=0.1,
split_seed=0, max_disparity=None, loss_kind="smooth_l1")``. Layouts and the split are those of
:mod:`tasks.shards.stereo_sources` (``kitti2015``, ``kitti2012``, ``sceneflow``, ``middlebury``), so
this task gives, sample for sample, what the task of the same folder packed into shards
(:func:`tasks.shards.pack.pack_dataset` with ``seed=split_seed``, then
:func:`tasks.shards.dataset.shard_task`) gives. Every pair is cropped bottom-centre to
``height`` × ``width``; by default the largest multiples of 64 within the smallest pair (only the
image headers are read to find it). Files are decoded when a sample is asked for; a broken file is a
``ValueError`` naming it then (packing checks every file up front).
"""

from __future__ import annotations

from pathlib import Path

import torch
from PIL import Image
from torch.utils.data import Dataset

from tasks.registry import DatasetError, Task, register_task
from tasks.shards.stereo_sources import (
    Pair,
    check_crop,
    default_crop,
    list_stereo,
    split_pairs,
    stereo_sample,
)
from tasks.stereo.task import epe_metric, stereo_loss

__all__ = ["StereoPairs", "stereo_folder_task"]


class StereoPairs(Dataset):
    """(left, right, disparity) files → sample dicts cropped to ``crop`` (h, w), bottom-centre."""

    def __init__(self, pairs: list[Pair], crop: tuple[int, int], max_disparity: float | None = None):
        self.pairs, self.crop, self.max_disparity = list(pairs), crop, max_disparity

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        pair = self.pairs[index]
        left, right, disparity = (path.read_bytes() for path in pair)
        return stereo_sample(left, right, disparity, self.crop, pair, self.max_disparity)


def _smallest(pairs: list[Pair]) -> tuple[int, int, Path]:
    """The smallest height and width over the left images (headers only) and the image that has it."""
    height = width = None
    name = pairs[0][0]
    for left, _, _ in pairs:
        try:
            with Image.open(left) as image:
                w, h = image.size
        except Exception as exc:
            raise DatasetError(f"stereo-folder: cannot read {left} as an image ({exc})") from None
        if height is None or h < height or w < width:
            name = left
            height, width = (h, w) if height is None else (min(h, height), min(w, width))
    return height, width, name


@register_task("stereo-folder")
def stereo_folder_task(
    data_dir: str | None = None,
    layout: str = "kitti2015",
    height: int | None = None,
    width: int | None = None,
    val_fraction: float = 0.1,
    split_seed: int = 0,
    max_disparity: float | None = None,
    loss_kind: str = "smooth_l1",
) -> Task:
    if data_dir is None:
        raise DatasetError(f"stereo-folder: needs a data directory (layout {layout})")
    train, val = list_stereo(data_dir, layout)
    if val is None:
        train, val = split_pairs(train, val_fraction, split_seed)
    min_h, min_w, name = _smallest(train + val)
    auto_h, auto_w = default_crop(min_h, min_w, name) if height is None or width is None else (0, 0)
    crop = check_crop((height or auto_h, width or auto_w), min_h, min_w, name)
    options = {
        "data_dir": str(Path(data_dir).expanduser()),
        "layout": layout,
        "height": crop[0],
        "width": crop[1],
        "val_fraction": val_fraction,
        "split_seed": split_seed,
        "max_disparity": max_disparity,
        "loss_kind": loss_kind,
    }
    return Task(
        name="stereo-folder",
        num_classes=None,
        input_size=(3, *crop),
        train_set=StereoPairs(train, crop, max_disparity),
        val_set=StereoPairs(val, crop, max_disparity),
        loss=stereo_loss(kind=loss_kind),
        metric=epe_metric,
        metric_name="epe",
        higher_is_better=False,
        options=options,
    )
