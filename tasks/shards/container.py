"""The shard file format: a few hundred samples, each a label and one or more byte blobs.

Layout (all integers little endian)::

    b"MANTASHD"                 8 bytes, magic
    version                     uint32, 1
    header length               uint32, N
    header                      N bytes: canonical JSON (keys sorted, no whitespace, ASCII)
                                {"blobs": [[len, ...], ...], "count": n, "format": "...", "labels": [...]}
    blobs                       every sample's blobs, concatenated in sample order

Offsets are not stored: they follow from the lengths, so one list of samples has exactly one
encoding (no timestamps, no padding) and re-packing the same files gives the same bytes — the
shard's SHA-256 (its name, :func:`shard_digest`) then stays the same too. Every sample of a shard has
the same number of blobs: 1 for images and CIFAR rows, 3 (left, right, disparity) for stereo pairs.

:func:`read_shard` checks the whole structure (magic, version, header, lengths adding up to the file
size exactly) and raises ``ValueError`` with a one-line message if anything is off; it does not
decode the blobs (that is the task's ``decode``).
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["MAGIC", "VERSION", "ShardReader", "ShardSample", "read_shard", "shard_digest", "write_shard"]

MAGIC = b"MANTASHD"
VERSION = 1
_PREFIX = struct.Struct("<8sII")
MAX_HEADER_BYTES = 16 << 20
MAX_BLOBS_PER_SAMPLE = 8


@dataclass(frozen=True)
class ShardSample:
    """One sample as stored: its label (0 where there is none, e.g. stereo) and its encoded blobs."""

    label: int
    blobs: tuple[bytes, ...]


def shard_digest(data: bytes) -> str:
    """The shard's name: the SHA-256 (hex) of its bytes."""
    return hashlib.sha256(data).hexdigest()


def _header_bytes(header: dict) -> bytes:
    return json.dumps(header, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")


def write_shard(format: str, samples: Sequence[ShardSample]) -> bytes:
    """The bytes of a shard holding ``samples`` in order (deterministic: same input, same bytes)."""
    if not samples:
        raise ValueError("shard: needs at least one sample")
    arity = len(samples[0].blobs)
    if not 1 <= arity <= MAX_BLOBS_PER_SAMPLE:
        raise ValueError(f"shard: a sample holds {arity} blobs, expected 1 to {MAX_BLOBS_PER_SAMPLE}")
    for position, sample in enumerate(samples):
        if len(sample.blobs) != arity:
            raise ValueError(
                f"shard: sample {position} holds {len(sample.blobs)} blobs, sample 0 holds {arity}"
            )
    header = _header_bytes(
        {
            "format": str(format),
            "count": len(samples),
            "labels": [int(s.label) for s in samples],
            "blobs": [[len(b) for b in s.blobs] for s in samples],
        }
    )
    parts = [_PREFIX.pack(MAGIC, VERSION, len(header)), header]
    for sample in samples:
        parts.extend(bytes(b) for b in sample.blobs)
    return b"".join(parts)


class ShardReader:
    """A parsed shard: ``format``, ``len()``, ``labels`` and ``sample(i)`` (blobs sliced lazily)."""

    def __init__(self, data: bytes, format: str, labels: list[int], lengths: list[list[int]], start: int):
        self._data = memoryview(data)
        self.format = format
        self.labels = labels
        self._offsets: list[tuple[int, ...]] = []
        position = start
        for row in lengths:
            offsets = []
            for length in row:
                offsets.append(position)
                position += length
            offsets.append(position)
            self._offsets.append(tuple(offsets))

    def __len__(self) -> int:
        return len(self.labels)

    def sample(self, index: int) -> ShardSample:
        if not 0 <= index < len(self.labels):
            raise IndexError(f"shard: sample {index} out of range 0..{len(self.labels) - 1}")
        offsets = self._offsets[index]
        blobs = tuple(bytes(self._data[a:b]) for a, b in zip(offsets[:-1], offsets[1:]))
        return ShardSample(self.labels[index], blobs)


def _malformed(reason: str) -> ValueError:
    return ValueError(f"shard: malformed ({reason})")


def read_shard(data: bytes) -> ShardReader:
    """Parse a shard's bytes; ``ValueError`` (one line) if they are not a well-formed shard."""
    if len(data) < _PREFIX.size:
        raise _malformed(f"{len(data)} bytes is shorter than the {_PREFIX.size}-byte prefix")
    magic, version, header_length = _PREFIX.unpack_from(data, 0)
    if magic != MAGIC:
        raise _malformed(f"magic {magic!r} is not {MAGIC!r}")
    if version != VERSION:
        raise _malformed(f"version {version} is not {VERSION}")
    start = _PREFIX.size + header_length
    if header_length > MAX_HEADER_BYTES or start > len(data):
        raise _malformed(f"header of {header_length} bytes does not fit in {len(data)} bytes")
    raw = bytes(data[_PREFIX.size : start])
    try:
        header = json.loads(raw.decode("ascii"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _malformed(f"header is not JSON: {str(exc).splitlines()[0]}") from None
    if not isinstance(header, dict) or set(header) != {"format", "count", "labels", "blobs"}:
        raise _malformed("header must hold exactly format, count, labels, blobs")
    fmt, count, labels, lengths = header["format"], header["count"], header["labels"], header["blobs"]

    def is_int(value) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and value >= 0

    if not isinstance(fmt, str) or not fmt:
        raise _malformed("format is not a name")
    if not is_int(count) or count < 1:
        raise _malformed(f"count {count!r} is not a positive integer")
    if not isinstance(labels, list) or len(labels) != count or not all(is_int(v) for v in labels):
        raise _malformed(f"labels are not {count} non-negative integers")
    if not isinstance(lengths, list) or len(lengths) != count:
        raise _malformed(f"blobs do not list {count} samples")
    arity = len(lengths[0]) if isinstance(lengths[0], list) else -1
    if not 1 <= arity <= MAX_BLOBS_PER_SAMPLE:
        raise _malformed("sample 0 lists no blob lengths")
    total = 0
    for position, row in enumerate(lengths):
        if not isinstance(row, list) or len(row) != arity or not all(is_int(v) for v in row):
            raise _malformed(f"sample {position} does not list {arity} blob lengths")
        total += sum(row)
    if start + total != len(data):
        raise _malformed(f"blobs add up to {start + total} bytes but the shard has {len(data)}")
    if raw != _header_bytes(header):
        raise _malformed("header is not canonical JSON")
    return ShardReader(data, fmt, labels, lengths, start)
