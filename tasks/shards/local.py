"""A task's shards in a directory on this machine: the aggregator's packed data, a peer's cache.

Both keep the same layout, so one function opens either as a :class:`tasks.registry.Task`::

    <directory>/manifest.json        the shard list, canonical JSON (protocol.shards.manifest_bytes)
    <directory>/shards/<digest>.shard

A shard that is not (yet) there reads as missing (:class:`tasks.shards.dataset.ShardMissing` when a
sample of it is asked for): a peer holds only the shards it trains on.
"""

from __future__ import annotations

import os
from pathlib import Path

from protocol.shards import DataManifest, DataSpec, ShardEntry, check_manifest, manifest_bytes, parse_manifest
from tasks.registry import Task
from tasks.shards.dataset import shard_task

__all__ = [
    "MANIFEST_FILE",
    "SHARDS_DIR",
    "local_shard_task",
    "read_manifest",
    "shard_locator",
    "write_manifest",
]

MANIFEST_FILE = "manifest.json"
SHARDS_DIR = "shards"


def write_manifest(directory: Path, manifest: DataManifest) -> Path:
    """Write the manifest atomically (a reader never sees half of it)."""
    directory.mkdir(parents=True, exist_ok=True)
    path, tmp = directory / MANIFEST_FILE, directory / f"{MANIFEST_FILE}.tmp"
    tmp.write_bytes(manifest_bytes(manifest))
    os.replace(tmp, path)
    return path


def read_manifest(directory: Path, data: DataSpec) -> DataManifest:
    """The manifest in ``directory``, checked against the task's signed data description
    (``protocol.shards.ManifestMismatch`` if it is not that shard list; FileNotFoundError if absent)."""
    manifest = parse_manifest((Path(directory) / MANIFEST_FILE).read_bytes())
    check_manifest(manifest, data)
    return manifest


def shard_locator(directory: Path):
    """``locate(entry)``: the path of the entry's shard file in ``directory/shards``, None if absent."""
    shards = Path(directory) / SHARDS_DIR

    def locate(entry: ShardEntry) -> Path | None:
        path = shards / f"{entry.digest}.shard"
        return path if path.is_file() else None

    return locate


def local_shard_task(data: DataSpec, directory: Path) -> tuple[Task, DataManifest]:
    """The task whose samples are the shards in ``directory`` (see the module docstring)."""
    manifest = read_manifest(directory, data)
    task = shard_task(data, manifest, shard_locator(directory))
    task.manifest = manifest
    return task, manifest
