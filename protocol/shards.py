"""Content-addressed training data: the shard list a task signs, and its Merkle root.

An operator's dataset is packed once into shards (files of a few hundred samples each). Each shard is
named by the SHA-256 of its bytes, so whoever serves it — the aggregator or any peer that holds it —
cannot change a byte without the receiver noticing. The task (:class:`protocol.task_spec.TaskSpec`)
carries a :class:`DataSpec` whose ``root`` is the RFC 9162 Merkle root over the canonical JSON of every
:class:`ShardEntry` in order: a peer that fetched the :class:`DataManifest` from anyone recomputes the
root and refuses the task's data if it differs (:func:`check_manifest`). Re-packing the same files
gives the same shards, the same entries and the same root.

Samples are numbered within their split: the train split's shards hold samples ``first_sample ..
first_sample + samples - 1`` in shard order, with no gaps; so are the validation shards.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Literal, get_args

from pydantic import Field, ValidationError

from protocol.canonical import canonical_json
from protocol.fields import Hex32, Int53, Name, StrictModel, Text
from protocol.merkle import tree_root

__all__ = [
    "DATA_KINDS",
    "DataKind",
    "DataManifest",
    "DataSpec",
    "ManifestMismatch",
    "ShardEntry",
    "check_manifest",
    "held_shards",
    "holdings_bitmap",
    "manifest_bytes",
    "manifest_root",
    "parse_manifest",
]

DataKind = Literal["imagefolder", "cifar10", "stereo-folder"]
"""The kinds of operator data set a task can sign: each is also the name of the built-in task
(:mod:`tasks`) that reads such a data set from local files."""

DATA_KINDS: tuple[DataKind, ...] = get_args(DataKind)
"""Every :data:`DataKind`, in order: the one list per-kind tables elsewhere are checked against."""

MAX_SHARDS = 1 << 16
MAX_CLASSES = 4096
MAX_MANIFEST_BYTES = 32 << 20


class ShardEntry(StrictModel):
    """One shard: where its samples sit in their split, what it holds, and the hash of its bytes."""

    index: Int53  # position in the manifest (train shards first, then validation)
    split: Literal["train", "val"]
    digest: Hex32  # SHA-256 of the shard file's bytes: its name everywhere
    size: Annotated[int, Field(ge=1, le=1 << 34)]  # bytes on the wire
    first_sample: Int53  # index of its first sample within its split
    samples: Annotated[int, Field(ge=1, le=1 << 24)]
    format: Name  # how its samples are encoded, e.g. "image/png", "cifar/chw-u8", "stereo/kitti2015"
    decoded_shape: Annotated[tuple[Int53, ...], Field(min_length=1, max_length=4)]  # per sample, as decoded
    decoded_bytes: Int53  # bytes of all its samples once decoded (what a peer's memory holds)


class DataSpec(StrictModel):
    """What a task's signed record says about its data (the shard list itself travels separately)."""

    kind: DataKind
    layout: Name  # "tree" or "train-val" (imagefolder), "python" (cifar10), "kitti2015", ... (stereo)
    root: Hex32  # Merkle root over the shard entries (see manifest_root)
    shards: Annotated[int, Field(ge=1, le=MAX_SHARDS)]
    train_samples: Annotated[int, Field(ge=1, le=1 << 40)]
    val_samples: Annotated[int, Field(ge=1, le=1 << 40)]
    sample_shape: Annotated[tuple[Int53, ...], Field(min_length=2, max_length=4)]  # what the model takes
    classes: Annotated[tuple[Text, ...], Field(max_length=MAX_CLASSES)] = ()  # empty for stereo
    bytes: Int53  # all shards together: what a peer holding everything would have downloaded


class DataManifest(StrictModel):
    """The full shard list, as the aggregator serves it; checked against a :class:`DataSpec`."""

    shards: Annotated[tuple[ShardEntry, ...], Field(min_length=1, max_length=MAX_SHARDS)]

    def split(self, name: str) -> tuple[ShardEntry, ...]:
        return tuple(s for s in self.shards if s.split == name)


class ManifestMismatch(ValueError):
    """A manifest does not match the task's signed data description; the message says how."""


def manifest_root(entries: tuple[ShardEntry, ...] | list[ShardEntry]) -> str:
    """The Merkle root (hex) over the canonical JSON of each entry, in order."""
    return tree_root([canonical_json(e.model_dump(mode="json")) for e in entries]).hex()


def parse_manifest(raw: bytes) -> DataManifest:
    """A manifest from its canonical JSON bytes; ManifestMismatch (one line) if malformed."""
    if len(raw) > MAX_MANIFEST_BYTES:
        raise ManifestMismatch(f"manifest of {len(raw)} bytes is over the {MAX_MANIFEST_BYTES} limit")
    try:
        return DataManifest.model_validate_json(raw, strict=False)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise ManifestMismatch(f"manifest is malformed at {where or 'top'}: {err['msg']}") from None


def manifest_bytes(manifest: DataManifest) -> bytes:
    """The canonical bytes a manifest travels as (one encoding per manifest)."""
    return canonical_json(manifest.model_dump(mode="json"))


def check_manifest(manifest: DataManifest, spec: DataSpec) -> None:
    """Raise ManifestMismatch unless ``manifest`` is exactly the shard list ``spec`` signed: the same
    root, count and sample totals, indices in order, and each split's samples numbered without gaps."""
    root = manifest_root(manifest.shards)
    if root != spec.root:
        raise ManifestMismatch(
            f"shard list root {root[:16]}… does not match the task's signed {spec.root[:16]}…"
        )
    if len(manifest.shards) != spec.shards:
        raise ManifestMismatch(f"{len(manifest.shards)} shards listed, the task signed {spec.shards}")
    for position, entry in enumerate(manifest.shards):
        if entry.index != position:
            raise ManifestMismatch(f"shard {position} carries index {entry.index}")
    for name, total in (("train", spec.train_samples), ("val", spec.val_samples)):
        expected = 0
        for entry in manifest.split(name):
            if entry.first_sample != expected:
                raise ManifestMismatch(
                    f"{name} shard {entry.index} starts at sample {entry.first_sample}, not {expected}"
                )
            expected += entry.samples
        if expected != total:
            raise ManifestMismatch(f"{name} shards hold {expected} samples, the task signed {total}")


def holdings_bitmap(indices: Iterable[int]) -> str:
    """Hex bitmap of shard indices (bit ``i % 8`` of byte ``i // 8``), as a peer's progress record
    carries what it holds."""
    indices = sorted(set(indices))
    if not indices:
        return ""
    bits = bytearray(indices[-1] // 8 + 1)
    for i in indices:
        bits[i // 8] |= 1 << (i % 8)
    return bits.hex()


def held_shards(bitmap: str) -> set[int]:
    """The shard indices of a :func:`holdings_bitmap`."""
    bits = bytes.fromhex(bitmap)
    return {8 * byte + bit for byte, value in enumerate(bits) for bit in range(8) if value >> bit & 1}
