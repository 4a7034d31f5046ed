"""Each signed DHT record verified once, however often it is read.

A peer re-reads the same boards many times a round (progress while it computes, commit reports while
it waits for a quorum, the roster each round). Nearly every entry it reads is one it has read before,
byte for byte; re-checking its Ed25519 signature and schema each time would make every read cost a
verification per record of every peer (O(n) per read, O(n^2) over the swarm). The cache maps the
exact (subkey, value) bytes to what opening them gave, so a repeated entry costs one dictionary
lookup, and only new bytes are verified. A rejection is cached too (the same bytes stay invalid).

Bounded (least recently used out first) and guarded by a lock (the round thread and the announcer
may read at once).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

from protocol.sealing import RecordRejected

T = TypeVar("T")

DEFAULT_CAPACITY = 4096  # entries: a few rounds of every board of a swarm of hundreds
_UNSEEN = object()  # what the cache answers for an entry it has not verified (an opener may return None)


def _fingerprint(subkey: Any, value: Any) -> Hashable | None:
    """A hashable key for exactly these bytes; None for values that are not plain bytes (not cached)."""
    if isinstance(value, bytes | bytearray):
        return (str(subkey), bytes(value))
    if isinstance(value, list | tuple) and all(isinstance(v, bytes | bytearray) for v in value):
        return (str(subkey), tuple(bytes(v) for v in value))
    return None


class VerifiedRecords(Generic[T]):
    """``open(subkey, value)`` = ``opener(subkey, value)``, computed once per distinct entry."""

    def __init__(self, opener: Callable[[Any, Any], T], capacity: int = DEFAULT_CAPACITY):
        self._opener, self._capacity = opener, capacity
        self._lock = threading.Lock()  # guards _seen, _hits and _checks
        self._seen: OrderedDict[Hashable, T | RecordRejected] = OrderedDict()
        self._hits = self._checks = 0

    def open(self, subkey: Any, value: Any) -> T:
        """The opened record; raises :class:`RecordRejected` as the opener did."""
        key = _fingerprint(subkey, value)
        if key is not None:
            with self._lock:
                known = self._seen.get(key, _UNSEEN)
                if known is not _UNSEEN:
                    self._seen.move_to_end(key)
                    self._hits += 1
            if known is not _UNSEEN:
                if isinstance(known, RecordRejected):
                    raise known
                return known
        try:
            result: T | RecordRejected = self._opener(subkey, value)
        except RecordRejected as e:
            result = e
        with self._lock:
            self._checks += 1
            if key is not None:
                self._seen[key] = result
                while len(self._seen) > self._capacity:
                    self._seen.popitem(last=False)
        if isinstance(result, RecordRejected):
            raise result
        return result

    @property
    def counts(self) -> tuple[int, int]:
        """(entries verified, entries answered from the cache) so far."""
        with self._lock:
            return self._checks, self._hits
