"""``imagefolder``: any directory of class folders, read with torchvision's ``ImageFolder``.

Layouts accepted (``data_dir`` = ``<dir>``):

* ``<dir>/<class>/<image>`` — one tree, split into train / validation by a stratified, seeded
  ``val_fraction`` (deterministic);
* ``<dir>/train/<class>/<image>`` and ``<dir>/val/<class>/<image>`` — a given split (the class
  folders of both must be the same).

Classes are the sorted folder names. Image files: ``.jpg .jpeg .png .ppm .bmp .pgm .tif .tiff
.webp``. A missing directory, no class folders, or a class folder without images raises
:class:`~tasks.registry.DatasetError` with a one-line message.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from torch.utils.data import Subset
from torchvision.datasets import ImageFolder
from torchvision.datasets.folder import IMG_EXTENSIONS

from tasks.digits import stratified_split
from tasks.registry import DatasetError, Task, classification_loss, register_task
from tasks.transforms import IMAGENET_MEAN, IMAGENET_STD, crop_and_flip, pil_image_transform

__all__ = ["imagefolder_task"]

_LAYOUT = "expected <dir>/<class>/<image> or <dir>/train/<class>/<image> plus <dir>/val/<class>/<image>"


def _class_folders(root: Path) -> list[Path]:
    return sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))


def _check_tree(root: Path) -> None:
    classes = _class_folders(root)
    if not classes:
        raise DatasetError(f"imagefolder: no class folders in {root} ({_LAYOUT})")
    for folder in classes:
        if not any(f.is_file() and f.name.lower().endswith(IMG_EXTENSIONS) for f in folder.rglob("*")):
            raise DatasetError(
                f"imagefolder: class folder {folder} has no image files ({', '.join(IMG_EXTENSIONS)})"
            )


def _open(root: Path, transform) -> ImageFolder:
    _check_tree(root)
    try:
        return ImageFolder(str(root), transform=transform)
    except (FileNotFoundError, RuntimeError, OSError) as exc:  # torchvision's own layout checks
        raise DatasetError(f"imagefolder: cannot read {root}: {exc}") from None


@register_task("imagefolder")
def imagefolder_task(
    data_dir: str | None = None,
    image_size: int = 32,
    val_fraction: float = 0.2,
    split_seed: int = 0,
    augment: bool = True,
    hflip: bool = False,
    grayscale: bool = False,
    label_smoothing: float = 0.0,
) -> Task:
    if data_dir is None:
        raise DatasetError(f"imagefolder: needs a data directory ({_LAYOUT})")
    root = Path(data_dir).expanduser()
    if not root.exists():
        raise DatasetError(f"imagefolder: {root} does not exist ({_LAYOUT})")
    if not root.is_dir():
        raise DatasetError(f"imagefolder: {root} is not a directory ({_LAYOUT})")
    channels = 1 if grayscale else 3
    mean, std = ((0.5,), (0.5,)) if grayscale else (IMAGENET_MEAN, IMAGENET_STD)

    transform = pil_image_transform(image_size, mean, std, grayscale=grayscale)
    if (root / "train").is_dir():
        val_root = root / "val"
        if not val_root.is_dir():
            raise DatasetError(f"imagefolder: {root}/train exists but {val_root} does not ({_LAYOUT})")
        train_set = _open(root / "train", transform)
        val_set = _open(val_root, transform)
        if train_set.classes != val_set.classes:
            raise DatasetError(
                f"imagefolder: class folders differ between {root / 'train'} ({len(train_set.classes)}) "
                f"and {val_root} ({len(val_set.classes)})"
            )
        classes = train_set.classes
    else:
        full = _open(root, transform)
        labels = np.asarray(full.targets)
        if len(labels) < 2:
            raise DatasetError(f"imagefolder: {root} has {len(labels)} image(s); need at least 2 to split")
        train_idx, val_idx = stratified_split(labels, val_fraction, split_seed)
        if len(train_idx) == 0 or len(val_idx) == 0:
            raise DatasetError(
                f"imagefolder: too few images in {root} for val_fraction={val_fraction}; "
                "add images or give train/ and val/ folders"
            )
        train_set, val_set = Subset(full, train_idx.tolist()), Subset(full, val_idx.tolist())
        classes = full.classes
    return Task(
        name="imagefolder",
        num_classes=len(classes),
        input_size=(channels, image_size, image_size),
        train_set=train_set,
        val_set=val_set,
        loss=classification_loss(label_smoothing),
        augmentation=crop_and_flip(image_size, hflip=hflip) if augment else None,
        classes=tuple(classes),
        options={"data_dir": str(root), "image_size": image_size, "val_fraction": val_fraction},
    )
