"""The operator's dataset in the swarm: packed once into shards, then served to every peer over libp2p.

``manta-aggregator start --task task.toml`` with a ``[data]`` section packs the folder it names
(:func:`pack_into`, before anything is signed or published: a bad file stops the start with one line and
leaves nothing behind) into ``<data dir>/data/shards/<digest>.shard`` plus ``manifest.json``; the task's
signed :class:`protocol.shards.DataSpec` carries the shard list's Merkle root. While the aggregator
runs, :class:`DataDesk` serves the shard list and the shards (peers fetch from each other too) and
gives the checkpoints, audits and evaluation the task read from those shards.
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

from aggregator.task_publication import DataRequest, PackData, TaskFileError
from hivemind_adapter.p2p import Endpoint
from hivemind_adapter.paged_blobs import BlobServer
from hivemind_adapter.shard_transfer import ShardServer
from protocol.handler_names import manifest_handler, shard_handler
from protocol.shards import DataSpec, ManifestMismatch, manifest_bytes
from protocol.task_spec import TaskSpec
from tasks.registry import DatasetError, Task
from tasks.shards.local import SHARDS_DIR, local_shard_task, write_manifest
from tasks.shards.pack import shard_path

logger = logging.getLogger(__name__)

DATA_DIR = "data"  # under the aggregator's data dir: manifest.json and shards/


def pack_into(data_dir_for) -> PackData:
    """A :data:`PackData` that packs into ``data_dir_for(task_id) / "data"`` with a progress line."""

    def pack(task_id: str, seed: int, request: DataRequest) -> DataSpec:
        from tasks.shards.pack import pack_dataset  # reads images: only when there is data to pack

        directory = Path(data_dir_for(task_id)) / DATA_DIR
        shown = [0.0]

        def progress(done: int, total: int) -> None:
            if time.monotonic() - shown[0] >= 1.0 or done == total:
                shown[0] = time.monotonic()
                print(
                    f"\rpacking {request.kind} data: {done}/{total} samples",
                    end="",
                    file=sys.stderr,
                    flush=True,
                )

        started = time.monotonic()
        try:
            packed = pack_dataset(
                request.kind,
                request.path,
                directory / SHARDS_DIR,
                layout=request.layout,
                seed=seed,
                val_fraction=request.val_fraction,
                shard_samples=request.shard_samples,
                crop=request.crop,
                progress=progress,
            )
        except (DatasetError, ValueError, OSError) as e:
            print(file=sys.stderr)
            raise TaskFileError(" ".join(str(e).split())) from None
        print(file=sys.stderr)
        write_manifest(directory, packed.manifest, packed.spec)
        spec = packed.spec
        logger.info(
            f"packed {spec.train_samples} training and {spec.val_samples} validation samples into "
            f"{spec.shards} shards ({spec.bytes / 1e6:.1f} MB) in {time.monotonic() - started:.1f} s; "
            f"root {spec.root[:16]}"
        )
        return spec

    return pack


class DataDesk:
    """Serves a task's shard list and shards from ``<data dir>/data`` (see the module docstring)."""

    def __init__(self, endpoint: Endpoint, task: TaskSpec, data_dir: Path):
        if task.data is None:
            raise ValueError("DataDesk is for tasks on an operator's dataset")
        self.directory = Path(data_dir) / DATA_DIR
        try:
            self.task_data, self.manifest = local_shard_task(task.data, self.directory)
        except FileNotFoundError:
            raise TaskFileError(
                f"{self.directory} holds no packed data for task {task.task_id} (no manifest.json)"
            ) from None
        except ManifestMismatch as e:
            raise TaskFileError(f"{self.directory}/manifest.json is not the task's shard list: {e}") from None
        shards = self.directory / SHARDS_DIR
        missing = [e for e in self.manifest.shards if not shard_path(shards, e.digest).is_file()]
        if missing:
            raise TaskFileError(
                f"{self.directory}/{SHARDS_DIR} lacks {len(missing)} of the task's shards "
                f"(first: {missing[0].digest}.shard)"
            )
        self._digests = {e.digest for e in self.manifest.shards}
        self.shard_server = ShardServer(
            endpoint,
            lambda digest: shard_path(shards, digest) if digest in self._digests else None,
            handler=shard_handler(task.task_id),
        )
        self.manifest_server = BlobServer(endpoint, manifest_handler(task.task_id))
        self.manifest_server.put(task.data.root, manifest_bytes(self.manifest))

    @property
    def task(self) -> Task:
        return self.task_data

    def bytes_served(self) -> int:
        return self.shard_server.bytes_served

    def close(self) -> None:
        self.shard_server.close()
        self.manifest_server.close()


__all__ = ["DATA_DIR", "DataDesk", "pack_into"]
