"""The shards a peer keeps on disk, under a size limit (``--cache-size``), least recently used first out.

Each shard is a file ``<sha256 hex>.shard`` in one directory; it is written to a ``.tmp`` file and
renamed into place, so a crash leaves either the whole shard or a ``.tmp`` leftover (removed on the
next start), never a torn ``.shard``. Shards are checked against their digest when stored, not when
found on disk at start (hashing a cache of gigabytes would delay every start; whoever reads a shard
from another peer checks it anyway).

The shards of the current and next assignment are *pinned* (:meth:`ShardCache.pin`) and never
evicted. If the pinned shards alone exceed the limit, they are stored all the same — the peer could
not train otherwise — and :attr:`ShardCache.over_limit` says so, for the peer to tell its user. The
shard a :meth:`ShardCache.put` has just stored is not evicted by that put either (it is the most
recently used; everything else unpinned goes first).

A lock guards the index (digest -> size, in least-recently-used order); file reads and the writing
of a new shard's bytes happen outside it, its rename into place and every removal inside it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import threading
import uuid
from collections import OrderedDict
from collections.abc import Iterable
from pathlib import Path

logger = logging.getLogger(__name__)

SUFFIX = ".shard"
_NAME = re.compile(r"^([0-9a-f]{64})\.shard$")
_DIGEST = re.compile(r"^[0-9a-f]{64}$")
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([kmgtp]?)(i?)(b?)\s*$", re.IGNORECASE)
_POWERS = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4, "p": 5}


def parse_size(text: str) -> int:
    """Bytes in a size such as ``"2GB"``, ``"500MB"``, ``"2GiB"``, ``"1.5G"`` or ``"1048576"``.

    ``KB``/``MB``/``GB``/``TB`` are powers of 1000; ``KiB``/``MiB``/... and bare ``K``/``M``/``G``/``T``
    are powers of 1024 (as ``du`` and ``sort -S`` read them). Case does not matter. ValueError (one
    line) for anything else, or for a size that is not positive."""
    match = _SIZE.match(str(text))
    if not match:
        raise ValueError(f"cannot read {text!r} as a size (e.g. 500MB, 2GiB, 1.5G, 1048576)")
    number, unit, binary, byte = match.groups()
    if binary and not unit:
        raise ValueError(f"cannot read {text!r} as a size (e.g. 500MB, 2GiB, 1.5G, 1048576)")
    base = 1000 if unit and byte and not binary else 1024
    value = int(float(number) * base ** _POWERS[unit.lower()])
    if value <= 0:
        raise ValueError(f"size {text!r} is not positive")
    return value


class ShardCache:
    def __init__(self, directory: Path, max_bytes: int):
        if max_bytes <= 0:
            raise ValueError(f"cache size {max_bytes} is not positive")
        self.directory = Path(directory)
        self.max_bytes = int(max_bytes)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._index: OrderedDict[str, int] = OrderedDict()  # digest -> bytes, least recently used first
        self._pinned: frozenset[str] = frozenset()
        found: list[tuple[float, str, int]] = []
        for entry in os.scandir(self.directory):
            if entry.name.endswith(".tmp"):  # a write cut short
                try:
                    os.unlink(entry.path)
                except OSError as e:
                    logger.warning(f"cannot remove leftover {entry.name}: {e}")
                continue
            match = _NAME.match(entry.name)
            if not match or not entry.is_file(follow_symlinks=False):
                continue
            stat = entry.stat(follow_symlinks=False)
            found.append((stat.st_mtime, match.group(1), stat.st_size))
        for _mtime, digest, size in sorted(found):  # oldest written first out
            self._index[digest] = size
        self.evict()

    def _file(self, digest: str) -> Path:
        return self.directory / f"{digest}{SUFFIX}"

    def has(self, digest: str) -> bool:
        with self._lock:
            return digest in self._index

    def path(self, digest: str, touch: bool = True) -> Path | None:
        """The file of shard ``digest`` (marked used unless ``touch`` is False), None if not cached."""
        with self._lock:
            if digest not in self._index:
                return None
            if touch:
                self._index.move_to_end(digest)
        return self._file(digest)

    def put(self, digest: str, data: bytes) -> Path:
        """Store ``data`` as shard ``digest`` (ValueError unless it hashes to it), then evict down to
        the limit (never this shard, nor a pinned one). Its path."""
        if not _DIGEST.match(digest):
            raise ValueError(f"{digest[:80]!r} is not a shard digest (64 lowercase hex)")
        actual = hashlib.sha256(data).hexdigest()
        if actual != digest:
            raise ValueError(f"shard {digest[:12]}: its bytes hash to {actual[:12]}")
        final = self._file(digest)
        with self._lock:
            present = digest in self._index
            if present:
                self._index.move_to_end(digest)
        if not present:
            tmp = self.directory / f"{digest}.{uuid.uuid4().hex[:8]}.tmp"
            try:
                with open(tmp, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                with self._lock:  # a rename and its index entry together, so evict never splits them
                    os.replace(tmp, final)
                    self._index[digest] = len(data)
                    self._index.move_to_end(digest)
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise
        self._evict(keep=digest)
        return final

    def pin(self, digests: Iterable[str]) -> None:
        """Pin exactly ``digests`` (the current and next assignment's shards; they need not be cached
        yet); shards pinned before and not now may be evicted, which happens at once if over the limit."""
        with self._lock:
            self._pinned = frozenset(digests)
        self.evict()

    @property
    def pinned(self) -> frozenset[str]:
        with self._lock:
            return self._pinned

    def evict(self) -> list[str]:
        """Remove the least recently used unpinned shards until the total is at most the limit (or
        only pinned ones are left). The digests removed."""
        return self._evict(keep=None)

    def _evict(self, keep: str | None) -> list[str]:
        removed = []
        with self._lock:
            total = sum(self._index.values())
            for digest in list(self._index):
                if total <= self.max_bytes:
                    break
                if digest in self._pinned or digest == keep:
                    continue
                try:
                    self._file(digest).unlink(missing_ok=True)
                except OSError as e:  # left in the index: it may be removed later
                    logger.warning(f"cannot evict shard {digest[:12]}: {e}")
                    continue
                total -= self._index.pop(digest)
                removed.append(digest)
        return removed

    @property
    def used_bytes(self) -> int:
        with self._lock:
            return sum(self._index.values())

    @property
    def over_limit(self) -> bool:
        """True when the shards kept (pinned ones, or the one just stored) exceed the limit."""
        return self.used_bytes > self.max_bytes

    def digests(self) -> list[str]:
        """The cached shards, least recently used first."""
        with self._lock:
            return list(self._index)
