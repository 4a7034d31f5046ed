"""Sample listing and pack-time validation of the classification data sets: image folders and CIFAR-10.

A *source* lists the samples of both splits in a fixed order and, for each, ``load(ref)`` reads its
bytes once, decodes them to check them, and returns what goes into a shard (:class:`Loaded`). Errors
are :class:`~tasks.registry.DatasetError` with one line naming the file.

**Image folders** (``kind="imagefolder"``). Layouts: ``"tree"`` = ``<dir>/<class>/<image>`` (split by
:func:`tasks.digits.stratified_split`, as the ``imagefolder`` task splits it: same ``seed`` and
``val_fraction``, same samples), ``"train-val"`` = ``<dir>/train/<class>/...`` + ``<dir>/val/<class>/...``
(auto-detected when ``<dir>/train`` is a folder). Files are listed exactly as torchvision's
``ImageFolder`` lists them (classes sorted, ``sorted(os.walk(...))``, file names sorted, the same
extensions), so sample ``i`` of a split is the ``imagefolder`` task's sample ``i``. A sample is the
image file's original bytes; shards are ``"image/png"``, ``"image/jpeg"`` (``"image/<pil format>"``
for others) or ``"image/mixed"`` when one shard holds several formats (decoding sniffs the bytes).
Every image is decoded as RGB (grayscale and palette images become 3 channels, as torchvision's
loader makes them), and all must have one size: ``sample_shape`` is ``(3, H, W)``.

**CIFAR-10** (``kind="cifar10"``, layout ``"python"``): ``<dir>/cifar-10-batches-py/data_batch_1..5,
test_batch, batches.meta`` (``<dir>`` may be that folder itself). The pickles are read here (a
restricted unpickler: only NumPy arrays and plain values), not by torchvision, which would insist
on the MD5s of the original files. Train = the five data batches in order, val = ``test_batch``. A
sample is its row: 3072 bytes, uint8, channels first (``"cifar/chw-u8"``).
"""

from __future__ import annotations

import io
import os
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from tasks.registry import DatasetError
from tasks.shards.container import ShardSample

__all__ = [
    "CIFAR_FORMAT",
    "IMAGE_EXTENSIONS",
    "CifarSource",
    "ImageSource",
    "Loaded",
    "cifar10_source",
    "imagefolder_source",
]

# torchvision.datasets.folder.IMG_EXTENSIONS (not imported: that module loads all of torchvision's datasets)
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
CIFAR_FORMAT = "cifar/chw-u8"
CIFAR_FOLDER = "cifar-10-batches-py"
CIFAR_TRAIN = tuple(f"data_batch_{i}" for i in range(1, 6))
_TREE = "expected <dir>/<class>/<image> or <dir>/train/<class>/<image> plus <dir>/val/<class>/<image>"


@dataclass(frozen=True)
class Loaded:
    """One checked sample: what the shard stores, its format, its decoded shape and decoded bytes."""

    sample: ShardSample
    format: str
    shape: tuple[int, ...]
    decoded_bytes: int


# ---------------------------------------------------------------------------------------------- images


def _class_folders(root: Path) -> list[Path]:
    return sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))


def _list_tree(root: Path) -> tuple[list[str], list[tuple[Path, int]]]:
    """Classes and (file, label) in torchvision ImageFolder's order; DatasetError if malformed."""
    folders = _class_folders(root)
    if not folders:
        raise DatasetError(f"imagefolder: no class folders in {root} ({_TREE})")
    items: list[tuple[Path, int]] = []
    for label, folder in enumerate(folders):
        found = [
            Path(base) / name
            for base, _, names in sorted(os.walk(folder, followlinks=True))
            for name in sorted(names)
            if name.lower().endswith(IMAGE_EXTENSIONS)
        ]
        if not found:
            raise DatasetError(
                f"imagefolder: class folder {folder} has no image files ({', '.join(IMAGE_EXTENSIONS)})"
            )
        items += [(path, label) for path in found]
    return [f.name for f in folders], items


class ImageSource:
    """Image files of class folders (see the module docstring); checks that all have one size."""

    kind = "imagefolder"

    def __init__(self, layout: str, classes: list[str], train: list, val: list):
        self.layout, self.classes, self.train, self.val = layout, tuple(classes), train, val
        self._first: tuple[Path, tuple[int, int]] | None = None

    def load(self, ref: tuple[Path, int]) -> Loaded:
        path, label = ref
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise DatasetError(f"imagefolder: cannot read {path} ({exc.strerror or exc})") from None
        try:
            with Image.open(io.BytesIO(raw)) as image:
                kind = (image.format or "unknown").lower()
                rgb = image.convert("RGB")  # decodes every pixel
        except Exception as exc:  # PIL raises many types for broken files
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise DatasetError(f"imagefolder: cannot read {path} as an image ({reason})") from None
        size = rgb.size
        if self._first is None:
            self._first = (path, size)
        elif size != self._first[1]:
            first, (w0, h0) = self._first
            raise DatasetError(
                f"imagefolder: {path} is {size[0]}x{size[1]} but {first} is {w0}x{h0}: "
                "all images must have one size (resize them first)"
            )
        shape = (3, size[1], size[0])
        return Loaded(ShardSample(label, (raw,)), f"image/{kind}", shape, 3 * size[0] * size[1])

    def sample_shape(self, crop: tuple[int, int] | None = None) -> tuple[int, ...]:
        if crop is not None:
            raise ValueError("crop: only stereo data sets are cropped")
        assert self._first is not None, "sample_shape before any sample was loaded"
        width, height = self._first[1]
        return (3, height, width)


def imagefolder_source(path: Path, layout: str | None, seed: int, val_fraction: float) -> ImageSource:
    """The samples of an image folder, split (see the module docstring); DatasetError if malformed."""
    from tasks.digits import stratified_split

    if not path.exists():
        raise DatasetError(f"imagefolder: {path} does not exist ({_TREE})")
    if not path.is_dir():
        raise DatasetError(f"imagefolder: {path} is not a directory ({_TREE})")
    if layout is None:
        layout = "train-val" if (path / "train").is_dir() else "tree"
    if layout == "train-val":
        for name in ("train", "val"):
            if not (path / name).is_dir():
                raise DatasetError(f"imagefolder: {path / name} is not a folder (layout train-val: {_TREE})")
        classes, train = _list_tree(path / "train")
        val_classes, val = _list_tree(path / "val")
        if classes != val_classes:
            raise DatasetError(
                f"imagefolder: class folders differ between {path / 'train'} ({len(classes)}) "
                f"and {path / 'val'} ({len(val_classes)})"
            )
    elif layout == "tree":
        classes, items = _list_tree(path)
        labels = np.asarray([label for _, label in items])
        train_idx, val_idx = stratified_split(labels, val_fraction, seed)
        train, val = [items[i] for i in train_idx], [items[i] for i in val_idx]
    else:
        raise DatasetError(f"imagefolder: unknown layout {layout!r} (expected 'tree' or 'train-val')")
    if not train or not val:
        raise DatasetError(
            f"imagefolder: {len(train)} training and {len(val)} validation images in {path} "
            f"(val_fraction={val_fraction}): both splits need images; add images or give train/ and val/"
        )
    return ImageSource(layout, classes, train, val)


# ----------------------------------------------------------------------------------------------- CIFAR

_ALLOWED_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "scalar"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("_codecs", "encode"),
}


class _ArrayUnpickler(pickle.Unpickler):
    """Unpickles NumPy arrays, dicts, lists, strings and numbers; refuses anything else."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED_GLOBALS:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}")


def _get(entry: dict, key: str) -> Any:
    """``entry[key]`` whether the pickle's keys are str or bytes (Python 2 pickles give bytes)."""
    if key in entry:
        return entry[key]
    return entry.get(key.encode("ascii"))


def _cifar_layout(root: Path) -> str:
    return f"{root}/{CIFAR_FOLDER}/data_batch_1..data_batch_5, test_batch, batches.meta"


def _load_pickle(path: Path, root: Path) -> dict:
    try:
        with path.open("rb") as handle:
            entry = _ArrayUnpickler(handle, encoding="latin1").load()
    except FileNotFoundError:
        raise DatasetError(f"cifar10: {path} is missing; expected {_cifar_layout(root)}") from None
    except Exception as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise DatasetError(f"cifar10: cannot read {path} as a CIFAR-10 python batch ({reason})") from None
    if not isinstance(entry, dict):
        raise DatasetError(f"cifar10: {path} holds a {type(entry).__name__}, not a CIFAR-10 batch dict")
    return entry


def _load_batch(path: Path, root: Path, classes: int) -> tuple[np.ndarray, np.ndarray]:
    entry = _load_pickle(path, root)
    data, labels = _get(entry, "data"), _get(entry, "labels")
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:
        got = f"{data.dtype} {data.shape}" if isinstance(data, np.ndarray) else type(data).__name__
        raise DatasetError(f"cifar10: {path}: 'data' must be a uint8 N x 3072 array, got {got}")
    try:
        labels = np.asarray(labels, dtype=np.int64)
    except (TypeError, ValueError):
        labels = None
    if labels is None or labels.shape != (len(data),):
        raise DatasetError(f"cifar10: {path}: 'labels' must list one integer per row of 'data' ({len(data)})")
    if len(labels) and (labels.min() < 0 or labels.max() >= classes):
        raise DatasetError(f"cifar10: {path}: labels must be in 0..{classes - 1}")
    return data, labels


class CifarSource:
    """CIFAR-10 rows (see the module docstring)."""

    kind = "cifar10"
    layout = "python"

    def __init__(
        self, classes: list[str], train: tuple[np.ndarray, np.ndarray], val: tuple[np.ndarray, np.ndarray]
    ):
        self.classes = tuple(classes)
        self._arrays = {"train": train, "val": val}
        self.train = [("train", i) for i in range(len(train[0]))]
        self.val = [("val", i) for i in range(len(val[0]))]

    def load(self, ref: tuple[str, int]) -> Loaded:
        split, index = ref
        data, labels = self._arrays[split]
        return Loaded(
            ShardSample(int(labels[index]), (data[index].tobytes(),)), CIFAR_FORMAT, (3, 32, 32), 3072
        )

    def sample_shape(self, crop: tuple[int, int] | None = None) -> tuple[int, ...]:
        if crop is not None:
            raise ValueError("crop: only stereo data sets are cropped")
        return (3, 32, 32)


def cifar10_source(path: Path, layout: str | None) -> CifarSource:
    if layout not in (None, "python"):
        raise DatasetError(
            f"cifar10: unknown layout {layout!r} (expected 'python': {_cifar_layout('<dir>')})"
        )
    root = path.parent if path.name == CIFAR_FOLDER else path
    folder = root / CIFAR_FOLDER
    if not folder.is_dir():
        raise DatasetError(f"cifar10: {folder} is not a folder; expected {_cifar_layout(root)}")
    missing = [n for n in (*CIFAR_TRAIN, "test_batch", "batches.meta") if not (folder / n).is_file()]
    if missing:
        raise DatasetError(
            f"cifar10: missing {', '.join(missing)} in {folder}; expected {_cifar_layout(root)}"
        )
    meta = _load_pickle(folder / "batches.meta", root)
    names = _get(meta, "label_names")
    if not isinstance(names, list) or not names:
        raise DatasetError(f"cifar10: {folder / 'batches.meta'} has no 'label_names' list")
    classes = [n.decode("latin1") if isinstance(n, bytes) else str(n) for n in names]
    batches = [_load_batch(folder / name, root, len(classes)) for name in CIFAR_TRAIN]
    train = (np.concatenate([b[0] for b in batches]), np.concatenate([b[1] for b in batches]))
    val = _load_batch(folder / "test_batch", root, len(classes))
    if len(train[0]) == 0 or len(val[0]) == 0:
        raise DatasetError(f"cifar10: {folder}: the data batches and test_batch must each hold images")
    return CifarSource(classes, train, val)
