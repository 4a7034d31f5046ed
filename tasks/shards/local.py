"""A task's shards in a directory on this machine: the aggregator's packed data, a peer's cache.

Both keep the same layout, so one function opens either as a :class:`tasks.registry.Task`::

    <directory>/data.json            the task's DataSpec (what the task signs), JSON
    <directory>/manifest.json        the shard list, canonical JSON (protocol.shards.manifest_bytes)
    <directory>/shards/<digest>.shard

With ``data.json`` the directory describes itself: ``manta-search --data DIR`` evaluates a checkpoint
on its validation split without the task record (:func:`open_shard_directory`).

A shard that is not (yet) there reads as missing (:class:`tasks.shards.dataset.ShardMissing` when a
sample of it is asked for): a peer holds only the shards it trains on.
"""

from __future__ import annotations

import os
from pathlib import Path

from protocol.shards import DataManifest, DataSpec, check_manifest, manifest_bytes, parse_manifest
from tasks.registry import Task
from tasks.shards.dataset import ShardDirectory, shard_task

__all__ = [
    "DATA_SPEC_FILE",
    "MANIFEST_FILE",
    "SHARDS_DIR",
    "local_shard_task",
    "open_shard_directory",
    "read_manifest",
    "write_manifest",
]

DATA_SPEC_FILE = "data.json"
MANIFEST_FILE = "manifest.json"
SHARDS_DIR = "shards"


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def write_manifest(directory: Path, manifest: DataManifest, data: DataSpec | None = None) -> Path:
    """Write the manifest (and the DataSpec, if given) atomically: a reader never sees half of one."""
    directory.mkdir(parents=True, exist_ok=True)
    if data is not None:
        _atomic_write(directory / DATA_SPEC_FILE, data.model_dump_json().encode())
    _atomic_write(directory / MANIFEST_FILE, manifest_bytes(manifest))
    return directory / MANIFEST_FILE


def open_shard_directory(directory: Path) -> Task:
    """The task of a self-describing shard directory (``data.json`` + ``manifest.json`` + shards, as
    ``manta-aggregator start`` leaves in ``<data dir>/data``); ValueError (one line) if it is not one."""
    directory = Path(directory)
    if (directory / "data" / DATA_SPEC_FILE).is_file():  # the aggregator's data dir itself
        directory = directory / "data"
    try:
        data = DataSpec.model_validate_json((directory / DATA_SPEC_FILE).read_bytes())
    except FileNotFoundError:
        raise ValueError(
            f"{directory}: no {DATA_SPEC_FILE} (give the data directory manta-aggregator packed)"
        ) from None
    except ValueError as e:
        raise ValueError(
            f"{directory / DATA_SPEC_FILE}: not a data description ({' '.join(str(e).split())[:120]})"
        ) from None
    try:
        return local_shard_task(data, directory)[0]
    except FileNotFoundError:
        raise ValueError(f"{directory}: no {MANIFEST_FILE}") from None


def read_manifest(directory: Path, data: DataSpec) -> DataManifest:
    """The manifest in ``directory``, checked against the task's signed data description
    (``protocol.shards.ManifestMismatch`` if it is not that shard list; FileNotFoundError if absent)."""
    manifest = parse_manifest((Path(directory) / MANIFEST_FILE).read_bytes())
    check_manifest(manifest, data)
    return manifest


def local_shard_task(data: DataSpec, directory: Path) -> tuple[Task, DataManifest]:
    """The task whose samples are the shards in ``directory`` (see the module docstring)."""
    manifest = read_manifest(directory, data)
    task = shard_task(data, manifest, ShardDirectory(Path(directory) / SHARDS_DIR))
    task.manifest = manifest
    return task, manifest
