"""Shards fetched in the background into the peer's :class:`peer.shard_cache.ShardCache`.

The peer says which shards it will need (:meth:`ShardDownloader.want`, the current assignment's
first, then the next one's) and waits for those it needs now (:meth:`ShardDownloader.wait`). A few
threads fetch them in the order asked, each from every holder ``sources_for(entry)`` names at the
time (:func:`hivemind_adapter.shard_transfer.fetch_shard`). A shard no holder yields goes back in
line after a backoff (doubling, capped) and is asked again of whoever holds it then, as long as the
downloader runs; :meth:`ShardDownloader.progress` tells how far it got, for the progress display.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from hivemind_adapter.p2p import Endpoint
from hivemind_adapter.shard_transfer import SHARD_HANDLER, ShardUnavailable, fetch_shard
from peer.shard_cache import ShardCache
from protocol.pages import PAGE_BYTES
from protocol.shards import ShardEntry

logger = logging.getLogger(__name__)


@dataclass
class DownloadProgress:
    """Shards (and bytes) downloaded of those wanted that were not cached when wanted. ``bytes_done``
    counts the bytes received so far of shards still in flight (at most each one's size)."""

    shards_done: int
    shards_wanted: int
    bytes_done: int
    bytes_wanted: int
    bytes_by_source: dict[str, int] = field(default_factory=dict)
    failures: int = 0
    last_error: str = ""


class ShardDownloader:
    def __init__(
        self,
        endpoint: Endpoint,
        cache: ShardCache,
        sources_for: Callable[[ShardEntry], list[str]],
        parallel: int = 2,
        stall_timeout: float = 10.0,
        *,
        fetch_timeout: float = 120.0,
        handler: str = SHARD_HANDLER,
        retry_delay: tuple[float, float] = (1.0, 60.0),  # first backoff, and its cap
        page_bytes: int = PAGE_BYTES,
    ):
        self.endpoint, self.cache, self.sources_for = endpoint, cache, sources_for
        self.stall_timeout, self.fetch_timeout, self.handler = stall_timeout, fetch_timeout, handler
        self.retry_delay, self.page_bytes = retry_delay, page_bytes
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._seq = itertools.count()
        self._ready: list[tuple[int, str]] = []  # (order wanted, digest): next to fetch
        self._later: list[tuple[float, int, str]] = []  # (time it may be retried, order, digest)
        self._entries: dict[str, ShardEntry] = {}  # queued or in flight
        self._attempts: dict[str, int] = {}
        self._order: dict[str, int] = {}  # when each was first wanted: retries keep their place
        self._received: dict[str, int] = {}  # bytes of each shard in flight so far
        self._shards_done = self._shards_wanted = self._bytes_done = self._bytes_wanted = 0
        self._bytes_by_source: dict[str, int] = {}
        self._failures = 0
        self._last_error = ""
        self._threads = [
            threading.Thread(target=self._work, name=f"shard-download-{i}", daemon=True)
            for i in range(max(1, parallel))
        ]
        for thread in self._threads:
            thread.start()

    def want(self, entries: Sequence[ShardEntry]) -> None:
        """Queue every entry not cached nor already queued, behind those wanted by earlier calls."""
        with self._cond:
            for entry in entries:
                if entry.digest in self._entries or self.cache.has(entry.digest):
                    continue
                self._entries[entry.digest] = entry
                self._attempts[entry.digest] = 0
                self._order[entry.digest] = next(self._seq)
                heapq.heappush(self._ready, (self._order[entry.digest], entry.digest))
                self._shards_wanted += 1
                self._bytes_wanted += entry.size
            self._cond.notify_all()

    def retain(self, entries: Sequence[ShardEntry]) -> int:
        """Forget the queued shards not among ``entries`` (a share that changed with the roster); a
        fetch in flight finishes. Returns how many were dropped."""
        keep = {e.digest for e in entries}
        with self._cond:
            dropped = [d for d in self._entries if d not in keep and d not in self._received]
            for digest in dropped:
                entry = self._entries.pop(digest)
                self._attempts.pop(digest, None)
                self._order.pop(digest, None)
                self._shards_wanted -= 1
                self._bytes_wanted -= entry.size
            if dropped:
                gone = set(dropped)
                self._ready = [item for item in self._ready if item[1] not in gone]
                self._later = [item for item in self._later if item[2] not in gone]
                heapq.heapify(self._ready)
                heapq.heapify(self._later)
            return len(dropped)

    def wait(self, entries: Sequence[ShardEntry], timeout: float) -> bool:
        """True once every entry is cached, and counted in :meth:`progress` where this downloader
        fetched it; False after ``timeout`` s (or once closed) if not."""
        deadline = time.monotonic() + timeout
        digests = [e.digest for e in entries]
        with self._cond:
            while True:
                # a shard in flight is stored before its fetch is counted (the store is off the lock)
                if all(self.cache.has(d) and d not in self._received for d in digests):
                    return True
                left = deadline - time.monotonic()
                if left <= 0 or self._stop.is_set():
                    return False
                # Woken by each shard this downloader stores; the short bound also sees shards
                # stored into the cache by anyone else.
                self._cond.wait(min(left, 0.5))

    def progress(self) -> DownloadProgress:
        with self._cond:
            in_flight = sum(
                min(n, self._entries[d].size) for d, n in self._received.items() if d in self._entries
            )
            return DownloadProgress(
                shards_done=self._shards_done,
                shards_wanted=self._shards_wanted,
                bytes_done=self._bytes_done + in_flight,
                bytes_wanted=self._bytes_wanted,
                bytes_by_source=dict(self._bytes_by_source),
                failures=self._failures,
                last_error=self._last_error,
            )

    def close(self, timeout: float = 5.0) -> None:
        """Stop the threads (a fetch in flight is cancelled); returns within about ``timeout`` s."""
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def _next(self) -> ShardEntry | None:
        """The next shard to fetch, waiting at most a moment (None: nothing now, or stopping)."""
        with self._cond:
            now = time.monotonic()
            while self._later and self._later[0][0] <= now:
                _, order, digest = heapq.heappop(self._later)
                heapq.heappush(self._ready, (order, digest))
            if not self._ready:
                wake = self._later[0][0] - now if self._later else 1.0
                self._cond.wait(max(0.01, min(wake, 1.0)))
                return None
            _, digest = heapq.heappop(self._ready)
            self._received[digest] = 0
            return self._entries[digest]

    def _work(self) -> None:
        while not self._stop.is_set():
            entry = self._next()
            if entry is not None:
                self._fetch(entry)

    def _fetch(self, entry: ShardEntry) -> None:
        digest = entry.digest

        def on_bytes(n: int) -> None:
            with self._cond:
                if digest in self._received:
                    self._received[digest] += n

        if self.cache.has(digest):  # stored meanwhile by someone else
            self._finish(entry, {})
            return
        try:
            sources = list(self.sources_for(entry))
            got = fetch_shard(
                self.endpoint,
                sources,
                digest,
                entry.size,
                handler=self.handler,
                timeout=self.fetch_timeout,
                stall_timeout=self.stall_timeout,
                on_bytes=on_bytes,
                cancel=self._stop,
                page_bytes=self.page_bytes,
            )
            self.cache.put(digest, got.data)
        except Exception as e:  # ShardUnavailable, a full disk, a sources_for that failed: retry later
            if self._stop.is_set():
                return
            reason = (
                str(e) if isinstance(e, ShardUnavailable) else f"shard {digest[:12]}: {type(e).__name__}: {e}"
            )
            self._retry(entry, reason.splitlines()[0] if reason else type(e).__name__)
            return
        if got.bad_sources:
            logger.warning(f"shard {digest[:12]}: {len(got.bad_sources)} source(s) served wrong bytes")
        self._finish(entry, got.bytes_by_source)

    def _finish(self, entry: ShardEntry, by_source: dict[str, int]) -> None:
        with self._cond:
            self._entries.pop(entry.digest, None)
            self._attempts.pop(entry.digest, None)
            self._order.pop(entry.digest, None)
            self._received.pop(entry.digest, None)
            self._shards_done += 1
            self._bytes_done += entry.size
            for source, n in by_source.items():
                self._bytes_by_source[source] = self._bytes_by_source.get(source, 0) + n
            self._cond.notify_all()

    def _retry(self, entry: ShardEntry, reason: str) -> None:
        with self._cond:
            attempts = self._attempts.get(entry.digest, 0) + 1
            self._attempts[entry.digest] = attempts
            self._received.pop(entry.digest, None)
            self._failures += 1
            self._last_error = reason
            first, cap = self.retry_delay
            delay = min(cap, first * 2 ** min(attempts - 1, 30))
            heapq.heappush(self._later, (time.monotonic() + delay, self._order[entry.digest], entry.digest))
            self._cond.notify_all()
        logger.info(f"{reason}; retrying in {delay:.0f} s")
