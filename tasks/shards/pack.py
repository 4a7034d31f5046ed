"""Packing an operator's data set into content-addressed shards, once, for a task to sign.

:func:`pack_dataset` lists the data set's samples (:mod:`tasks.shards.image_sources`,
:mod:`tasks.shards.stereo_sources`), reads and decodes each once to check it, and writes them in
order into shards of ``shard_samples`` samples (the last of a split may hold fewer): the training
split's shards first, then the validation split's. Each shard file is named ``<sha256>.shard``.
The result holds the :class:`~protocol.shards.DataManifest` (the shard list) and the
:class:`~protocol.shards.DataSpec` whose ``root`` is its Merkle root.

Deterministic: samples are listed in sorted order and split by ``seed``, and the shard encoding has
no timestamps, so packing the same files again gives byte-identical shards and the same root.

The training samples are shuffled across shards (:func:`training_order`, seeded by ``seed``): a
folder lists its images class by class, and a peer that trains on a few shards must not see a few
classes only. The validation split keeps the listed order.

Nothing half-published: shards are written into a temporary directory inside ``out_dir`` and moved
into place only once every sample has been packed and checked; on any error the temporary
directory is removed and ``out_dir`` is left as it was (created for the occasion and removed again
if it did not exist). A shard file already in ``out_dir`` with the right digest is kept as it is.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from protocol.shards import (
    DATA_KINDS,
    MAX_CLASSES,
    DataKind,
    DataManifest,
    DataSpec,
    ShardEntry,
    manifest_root,
)
from tasks.registry import DatasetError
from tasks.shards.container import ShardSample, shard_digest, write_shard
from tasks.shards.image_sources import CifarSource, Loaded, cifar10_source, imagefolder_source
from tasks.shards.stereo_sources import stereo_source

__all__ = ["SOURCES", "PackedData", "pack_dataset", "shard_path", "training_order"]


@dataclass(frozen=True)
class PackedData:
    """A packed data set: its signed description, its shard list, where the shards are, how long it took."""

    spec: DataSpec
    manifest: DataManifest
    directory: Path
    seconds: float


def shard_path(directory: Path | str, digest: str) -> Path:
    """Where the shard named ``digest`` lies in ``directory``."""
    return Path(directory) / f"{digest}.shard"


def _file_digest(path: Path) -> str | None:
    try:
        with path.open("rb") as handle:
            return hashlib.file_digest(handle, "sha256").hexdigest()
    except OSError:
        return None


def _cifar10_source(path: Path, layout: str | None, seed: int, val_fraction: float) -> CifarSource:
    return cifar10_source(path, layout)  # CIFAR-10 comes split: no seed, no val_fraction


SOURCES: dict[DataKind, Callable[[Path, str | None, int, float], Any]] = {
    "imagefolder": imagefolder_source,
    "cifar10": _cifar10_source,
    "stereo-folder": stereo_source,
}
"""Each data kind's lister: ``(path, layout, seed, val_fraction) -> source`` (DatasetError if unusable)."""


def _check_classes(kind: str, classes: tuple[str, ...]) -> None:
    """Class names travel in the signed task: printable ASCII, at most 256 characters, at most 4096."""
    if len(classes) > MAX_CLASSES:
        raise DatasetError(f"{kind}: {len(classes)} classes, at most {MAX_CLASSES} are supported")
    for name in classes:
        if len(name) > 256 or not all(" " <= c <= "~" for c in name):
            raise DatasetError(
                f"{kind}: class name {name!r} must be printable ASCII of at most 256 characters"
            )


class _Writer:
    """Cuts each split into shards, writes them into ``directory`` and collects their entries."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.entries: list[ShardEntry] = []
        self.bytes = 0

    def write(self, split: str, first_sample: int, loaded: list[Loaded]) -> None:
        formats = {item.format for item in loaded}
        if len(formats) == 1:
            fmt = formats.pop()
        elif all(f.startswith("image/") for f in formats):
            fmt = "image/mixed"
        else:
            raise AssertionError(f"one shard mixes sample formats {sorted(formats)}")
        samples: list[ShardSample] = [item.sample for item in loaded]
        data = write_shard(fmt, samples)
        digest = shard_digest(data)
        shard_path(self.directory, digest).write_bytes(data)
        shape = tuple(max(dims) for dims in zip(*(item.shape for item in loaded)))
        self.entries.append(
            ShardEntry(
                index=len(self.entries),
                split=split,
                digest=digest,
                size=len(data),
                first_sample=first_sample,
                samples=len(loaded),
                format=fmt,
                decoded_shape=shape,
                decoded_bytes=sum(item.decoded_bytes for item in loaded),
            )
        )
        self.bytes += len(data)


def _publish(staging: Path, out_dir: Path, entries: list[ShardEntry]) -> None:
    """Move the staged shards into ``out_dir``, keeping any that are already there with the right digest."""
    for digest in dict.fromkeys(e.digest for e in entries):
        source, target = shard_path(staging, digest), shard_path(out_dir, digest)
        if target.is_file() and _file_digest(target) == digest:
            continue
        os.replace(source, target)


def training_order(count: int, seed: int) -> list[int]:
    """The order the ``count`` listed training samples are packed in: a permutation seeded by ``seed``
    (the same on every machine and numpy version: numpy's PCG64 stream is stable)."""
    key = int.from_bytes(hashlib.sha256(f"manta.training-order|{seed}".encode()).digest()[:8], "big")
    return np.random.Generator(np.random.PCG64(key)).permutation(count).tolist()


def pack_dataset(
    kind: DataKind,
    path: Path | str,
    out_dir: Path | str,
    *,
    layout: str | None = None,
    seed: int = 0,
    val_fraction: float = 0.1,
    shard_samples: int = 500,
    crop: tuple[int, int] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> PackedData:
    """Pack the data set of ``kind`` at ``path`` into shards in ``out_dir`` (see the module docstring).

    ``layout``: imagefolder ``"tree"`` / ``"train-val"`` (detected if None), cifar10 ``"python"``,
    stereo-folder ``"kitti2015"``, ``"kitti2012"``, ``"sceneflow"`` or ``"middlebury"`` (required).
    ``seed`` and ``val_fraction`` split layouts without a validation split of their own. ``crop``
    (stereo only): the (height, width) samples are cropped to, default the largest multiples of 64
    within the smallest pair. ``progress(done, total)`` is called as samples are packed.

    Raises :class:`~tasks.registry.DatasetError` (one line, naming the file) for a malformed data set,
    ``ValueError`` for bad arguments.
    """
    started = time.perf_counter()
    if kind not in DATA_KINDS:
        raise ValueError(f"kind: {kind!r} is not one of {', '.join(DATA_KINDS)}")
    if isinstance(shard_samples, bool) or not isinstance(shard_samples, int) or shard_samples < 1:
        raise ValueError(f"shard_samples: {shard_samples!r} is not a positive integer")
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction: {val_fraction} is not between 0 and 1")
    if crop is not None and kind != "stereo-folder":
        raise ValueError(f"crop: only stereo-folder data sets are cropped, not {kind}")
    source = SOURCES[kind](Path(path).expanduser(), layout, seed, val_fraction)
    _check_classes(kind, source.classes)

    out_dir = Path(out_dir).expanduser()
    created = not out_dir.exists()
    out_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".packing-", dir=out_dir))
    try:
        writer = _Writer(staging)
        total, done = len(source.train) + len(source.val), 0
        if progress is not None:
            progress(0, total)
        train = [source.train[i] for i in training_order(len(source.train), seed)]
        for split, refs in (("train", train), ("val", source.val)):
            for first in range(0, len(refs), shard_samples):
                loaded = []
                for ref in refs[first : first + shard_samples]:
                    loaded.append(source.load(ref))
                    done += 1
                    if progress is not None:
                        progress(done, total)
                writer.write(split, first, loaded)
        sample_shape = source.sample_shape(crop)
        manifest = DataManifest(shards=tuple(writer.entries))
        spec = DataSpec(
            kind=kind,
            layout=source.layout,
            root=manifest_root(manifest.shards),
            shards=len(writer.entries),
            train_samples=len(source.train),
            val_samples=len(source.val),
            sample_shape=tuple(sample_shape),
            classes=tuple(source.classes),
            bytes=writer.bytes,
        )
        _publish(staging, out_dir, writer.entries)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        if created:
            shutil.rmtree(out_dir, ignore_errors=True)
        raise
    shutil.rmtree(staging, ignore_errors=True)
    return PackedData(spec, manifest, out_dir, time.perf_counter() - started)
