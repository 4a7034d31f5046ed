"""Training on shards: a torch ``Dataset`` over a split's shard files, and the task built from them.

:class:`ShardDataset` numbers the samples of one split's shards in order (sample ``i`` is sample
``i - first_sample`` of the shard whose range holds it), reads each shard file through ``locate``
(a peer holds only the shards it trains on: ``locate`` returns None for the others, and asking for
their samples raises :class:`ShardMissing`), checks its SHA-256 against the entry the first time it
opens it, keeps recently used shards mapped (``mmap``: the kernel's page cache holds the bytes) and
decodes samples with ``decode``. A worker draws its mini-batches at random from all of its shards,
so the cache holds many of them. Several threads may call ``__getitem__`` at once: a lock guards the
cache, never the reading or decoding.

:func:`shard_task` builds the :class:`~tasks.registry.Task` of a packed data set (after
:func:`protocol.shards.check_manifest`): its samples are what the file-based tasks give for the same
files — ``imagefolder``: (3×H×W float, normalised with ImageNet's mean/std, label) like
:mod:`tasks.imagefolder` (no resize: all images have the spec's size); ``cifar10``: the same with
CIFAR's mean/std, like :mod:`tasks.cifar`; ``stereo-folder``: sample dicts like
:class:`tasks.stereo.StereoFolder`, cropped (bottom-centre) to the spec's ``sample_shape``.
"""

from __future__ import annotations

import bisect
import hashlib
import io
import mmap
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

from protocol.shards import DataKind, DataManifest, DataSpec, ShardEntry, check_manifest
from tasks.registry import Task, classification_loss
from tasks.shards.container import ShardReader, ShardSample, read_shard
from tasks.shards.image_sources import CIFAR_FORMAT
from tasks.shards.stereo_sources import stereo_sample
from tasks.transforms import IMAGENET_MEAN, IMAGENET_STD, Normalize, crop_and_flip

__all__ = [
    "CifarDecoder",
    "ImageDecoder",
    "ShardDataset",
    "ShardDirectory",
    "ShardMissing",
    "StereoDecoder",
    "shard_task",
]

CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)  # tasks.cifar's (importing it loads torchvision's datasets)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)
TASK_OPTIONS: dict[DataKind, tuple[str, ...]] = {  # the options shard_task takes, per kind
    "imagefolder": ("augment", "hflip", "label_smoothing"),
    "cifar10": ("augment", "label_smoothing"),
    "stereo-folder": ("loss_kind", "max_disparity"),
}
FORMAT_PREFIXES: dict[DataKind, str] = {  # what every shard format of a kind starts with
    "imagefolder": "image/",
    "cifar10": CIFAR_FORMAT,
    "stereo-folder": "stereo/",
}


class ShardMissing(LookupError):
    """A sample's shard is not here (or its file does not hold the bytes the manifest names)."""

    def __init__(self, entry: ShardEntry, reason: str = "is not available here"):
        super().__init__(f"{entry.split} shard {entry.index} ({entry.digest}) {reason}")
        self.entry = entry


class ShardDirectory:
    """A ``locate`` for shards kept as ``<directory>/<digest>.shard`` (picklable, unlike a lambda):
    the path if the file is there, else None."""

    def __init__(self, directory: Path | str):
        self.directory = Path(directory)

    def __call__(self, entry: ShardEntry) -> Path | None:
        path = self.directory / f"{entry.digest}.shard"
        return path if path.is_file() else None

    def __repr__(self) -> str:
        return f"ShardDirectory({str(self.directory)!r})"


class ShardDataset(Dataset):
    """The samples of one split's shard ``entries`` (in manifest order, numbered from 0 without gaps)."""

    def __init__(
        self,
        entries: Sequence[ShardEntry],
        locate: Callable[[ShardEntry], Path | None],
        decode: Callable[[ShardSample], Any],
        *,
        cached_shards: int = 256,
        verify: bool = True,
    ):
        self.entries = tuple(entries)
        expected = 0
        for entry in self.entries:
            if entry.first_sample != expected:
                raise ValueError(
                    f"entries: shard {entry.index} starts at sample {entry.first_sample}, not {expected} "
                    "(give one split's shards, in order)"
                )
            expected += entry.samples
        self._starts = [entry.first_sample for entry in self.entries]
        self._length = expected
        self.locate, self.decode = locate, decode
        self.cached_shards, self.verify = max(1, int(cached_shards)), verify
        self._lock = threading.Lock()  # guards _cache and _verified
        self._cache: OrderedDict[int, ShardReader] = OrderedDict()
        self._verified: set[str] = set()  # digests whose file was hashed once already

    def __getstate__(self) -> dict[str, Any]:  # for DataLoader worker processes: no lock, no cache
        state = dict(self.__dict__)
        del state["_lock"], state["_cache"], state["_verified"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock, self._cache, self._verified = threading.Lock(), OrderedDict(), set()

    def __len__(self) -> int:
        return self._length

    def entry_of(self, index: int) -> ShardEntry:
        """The shard that holds sample ``index``."""
        if not 0 <= index < self._length:
            raise IndexError(f"sample {index} out of range 0..{self._length - 1}")
        return self.entries[bisect.bisect_right(self._starts, index) - 1]

    def _open(self, position: int) -> ShardReader:
        with self._lock:
            reader = self._cache.get(position)
            if reader is not None:
                self._cache.move_to_end(position)
                return reader
        entry = self.entries[position]
        path = self.locate(entry)
        if path is None:
            raise ShardMissing(entry)
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                # A peer's cache replaces files whole (os.replace), never in place, so the mapping
                # stays valid even after the file is evicted.
                data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
        except FileNotFoundError:
            raise ShardMissing(entry, f"is missing: no file {path}") from None
        with self._lock:
            known = entry.digest in self._verified
        if self.verify and not known:
            if len(data) != entry.size or hashlib.sha256(data).hexdigest() != entry.digest:
                raise ShardMissing(entry, f"does not match the bytes of {path}")
            with self._lock:
                self._verified.add(entry.digest)
        reader = read_shard(data)
        if len(reader) != entry.samples or reader.format != entry.format:
            raise ShardMissing(entry, f"holds {len(reader)} {reader.format} samples in {path}")
        with self._lock:
            self._cache[position] = reader
            self._cache.move_to_end(position)
            while len(self._cache) > self.cached_shards:
                self._cache.popitem(last=False)
        return reader

    def __getitem__(self, index: int) -> Any:
        index = int(index)
        if index < 0:
            index += self._length
        entry = self.entry_of(index)
        position = bisect.bisect_right(self._starts, index) - 1
        return self.decode(self._open(position).sample(index - entry.first_sample))


# ---------------------------------------------------------------------------------------------- decoders


def _to_float(chw: torch.Tensor) -> torch.Tensor:
    """uint8 → float32 in [0, 1], as ``v2.ToDtype(torch.float32, scale=True)`` computes it."""
    return chw.to(torch.float32).mul_(1.0 / 255)


class ImageDecoder:
    """An image sample (its file's bytes) → (3×H×W float32 normalised, label); RGB as torchvision loads it."""

    def __init__(self, mean: Sequence[float] = IMAGENET_MEAN, std: Sequence[float] = IMAGENET_STD):
        self.normalize = Normalize(mean, std)

    def __call__(self, sample: ShardSample) -> tuple[torch.Tensor, int]:
        with Image.open(io.BytesIO(sample.blobs[0])) as image:
            pixels = np.array(image.convert("RGB"), copy=True)
        chw = torch.from_numpy(pixels).permute(2, 0, 1)
        return self.normalize(_to_float(chw)), sample.label


class CifarDecoder:
    """A CIFAR row (3072 bytes, channels first) → (3×32×32 float32 normalised, label)."""

    def __init__(self, mean: Sequence[float] = CIFAR10_MEAN, std: Sequence[float] = CIFAR10_STD):
        self.normalize = Normalize(mean, std)

    def __call__(self, sample: ShardSample) -> tuple[torch.Tensor, int]:
        row = torch.frombuffer(bytearray(sample.blobs[0]), dtype=torch.uint8)
        return self.normalize(_to_float(row.view(3, 32, 32))), sample.label


class StereoDecoder:
    """A stereo sample (left, right, disparity bytes) → a sample dict cropped to ``crop`` (h, w)."""

    def __init__(self, crop: tuple[int, int], max_disparity: float | None = None):
        self.crop, self.max_disparity = (int(crop[0]), int(crop[1])), max_disparity

    def __call__(self, sample: ShardSample) -> dict[str, torch.Tensor]:
        left, right, disparity = sample.blobs
        return stereo_sample(left, right, disparity, self.crop, max_disparity=self.max_disparity)


# ------------------------------------------------------------------------------------------------- task


def shard_task(
    spec: DataSpec, manifest: DataManifest, locate: Callable[[ShardEntry], Path | None], **options: Any
) -> Task:
    """The task of a packed data set (see the module docstring); ``locate(entry)`` gives the path of a
    shard file held here, or None. Options: ``augment`` (True), ``hflip`` (False, imagefolder),
    ``label_smoothing`` (0.0) for classification; ``loss_kind`` ("smooth_l1"), ``max_disparity``
    (None) for stereo. Raises :class:`~protocol.shards.ManifestMismatch` if the manifest is not the
    one ``spec`` signed, ``ValueError`` for an unknown option."""
    check_manifest(manifest, spec)
    for key in options:
        if key not in TASK_OPTIONS[spec.kind]:
            raise ValueError(
                f"{key}: not an option of {spec.kind} shards (options: {', '.join(TASK_OPTIONS[spec.kind])})"
            )
    prefix = FORMAT_PREFIXES[spec.kind]
    for entry in manifest.shards:
        if not entry.format.startswith(prefix):
            raise ValueError(
                f"shard {entry.index}: format {entry.format!r} is not one of {spec.kind}'s ({prefix}...)"
            )
    info = {"root": spec.root, "layout": spec.layout, "shards": spec.shards, "bytes": spec.bytes}

    def split(name: str, decode: Callable[[ShardSample], Any]) -> ShardDataset:
        return ShardDataset(manifest.split(name), locate, decode)

    if spec.kind == "stereo-folder":
        from tasks.stereo.task import epe_metric, stereo_loss

        if len(spec.sample_shape) != 2:
            raise ValueError(f"sample_shape: {spec.sample_shape} is not (height, width) of a stereo data set")
        height, width = spec.sample_shape
        decode = StereoDecoder((height, width), options.get("max_disparity"))
        task = Task(
            name=spec.kind,
            num_classes=None,
            input_size=(3, height, width),
            train_set=split("train", decode),
            val_set=split("val", decode),
            loss=stereo_loss(kind=options.get("loss_kind", "smooth_l1")),
            metric=epe_metric,
            metric_name="epe",
            higher_is_better=False,
            options={**info, **options},
        )
        task.manifest = manifest  # the shard list the sets read from (Task.manifest)
        return task
    if len(spec.sample_shape) != 3:
        raise ValueError(f"sample_shape: {spec.sample_shape} is not (channels, height, width)")
    channels, height, width = spec.sample_shape
    augment = options.get("augment", True)
    if spec.kind == "cifar10":
        decode: Callable[[ShardSample], Any] = CifarDecoder()
        augmentation = crop_and_flip(32, hflip=True, crop_padding=4) if augment else None
    else:
        decode = ImageDecoder()
        augmentation = (
            crop_and_flip(min(height, width), hflip=options.get("hflip", False)) if augment else None
        )
    task = Task(
        name=spec.kind,
        num_classes=len(spec.classes),
        input_size=(channels, height, width),
        train_set=split("train", decode),
        val_set=split("val", decode),
        loss=classification_loss(options.get("label_smoothing", 0.0)),
        augmentation=augmentation,
        classes=tuple(spec.classes),
        options={**info, **options},
    )
    task.manifest = manifest
    return task
