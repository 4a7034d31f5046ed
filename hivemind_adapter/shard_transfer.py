"""Training-data shards served from disk over libp2p, and fetched from several holders at once.

A shard is a file named by the SHA-256 of its bytes (:class:`protocol.shards.ShardEntry`). The
aggregator serves every shard of a task; so does each peer for the shards it holds. Both answer one
handler with a :class:`ShardServer`, which reads the page asked for from the file on disk at its
offset (:mod:`protocol.pages`), so no node ever holds a dataset in memory to serve it.

:func:`fetch_shard` spreads a shard's pages over every source at once, a few requests in flight at
each (as :func:`hivemind_adapter.paged_blobs.fetch_spread` does), and checks the whole against the
digest. A source that errs or sends no page within ``stall_timeout`` is dropped and its pages go back
to the others. If the whole fails the hash, the whole alone cannot say which source lied, so each
source in turn completes its *own* copy (only the pages it has not served yet are asked again): the
first copy that passes is the shard, every source whose pages differ from it is named in
``bad_sources``, and a source whose own copy fails is named there too. One liar costs a refetch,
never the shard; every wait is bounded by ``stall_timeout`` and the whole call by ``timeout``.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from hivemind_adapter.p2p import Endpoint
from protocol.pages import PAGE_BYTES, error_page, page_request, parse_page_request, read_page, write_page

logger = logging.getLogger(__name__)

SHARD_HANDLER = "manta.shard"
IN_FLIGHT_PER_SOURCE = 4  # page requests outstanding at each source at once (see paged_blobs)
MISSING = "this node does not hold that shard"


class ShardUnavailable(RuntimeError):
    """No source yielded a shard's right bytes in time; one line saying why."""


def _read_page(locate: Callable[[str], Path | None], digest: str, offset: int, page_bytes: int):
    """``(file size, page)`` of shard ``digest`` at ``offset``, or None if this node lacks it. Runs in
    a worker thread (file IO, and ``locate`` may take a lock or stat a file)."""
    path = locate(digest)
    if path is None:
        return None
    try:
        with open(path, "rb") as f:
            total = os.fstat(f.fileno()).st_size
            if not 0 <= offset < total:
                return total, b""
            f.seek(offset)
            return total, f.read(page_bytes)
    except FileNotFoundError:  # evicted between locate and open
        return None


class ShardServer:
    """Answers page requests for the shards ``locate(digest)`` finds on disk (None: not held here).

    ``locate`` is called once per page, in a worker thread; the file is opened and the page read at
    its offset for each request, so a shard evicted meanwhile is answered with an error page.
    Nothing checks the file against its digest here: the receiver does."""

    def __init__(
        self,
        endpoint: Endpoint,
        locate: Callable[[str], Path | None],
        handler: str = SHARD_HANDLER,
        page_bytes: int = PAGE_BYTES,
    ):
        self.endpoint, self.locate, self.handler, self.page_bytes = endpoint, locate, handler, page_bytes
        self._lock = threading.Lock()
        self.pages_served = 0
        self.bytes_served = 0
        self.bytes_served_by_digest: dict[str, int] = {}
        endpoint.serve(handler, self._handle)

    def counters(self) -> tuple[int, int, dict[str, int]]:
        """A consistent ``(pages_served, bytes_served, bytes_served_by_digest copy)``."""
        with self._lock:
            return self.pages_served, self.bytes_served, dict(self.bytes_served_by_digest)

    async def _handle(self, payload: bytes, sender: str) -> bytes:
        try:
            digest, offset = parse_page_request(payload)
        except ValueError as e:
            return error_page(str(e))
        loop = asyncio.get_running_loop()
        try:
            found = await loop.run_in_executor(None, _read_page, self.locate, digest, offset, self.page_bytes)
        except Exception as e:  # unreadable file, a locate that raised: this node cannot serve it
            return error_page(f"cannot read that shard: {type(e).__name__}")
        if found is None:
            return error_page(MISSING)
        total, page = found
        if not page:
            return error_page(f"offset {offset} outside the shard ({total} bytes)")
        with self._lock:
            self.pages_served += 1
            self.bytes_served += len(page)
            self.bytes_served_by_digest[digest] = self.bytes_served_by_digest.get(digest, 0) + len(page)
        return write_page(total, offset, page)

    def close(self) -> None:
        self.endpoint.unserve(self.handler)


@dataclass
class ShardFetch:
    """A shard that passed its hash, and what each source did for it.

    ``bytes_by_source``: bytes each source sent that match the shard (they sum to its size unless a
    refetch was needed, when the source whose own copy passed also counts the pages it re-sent);
    ``bad_sources``: sources that sent bytes the hash refuted (never asked again in that call)."""

    data: bytes
    bytes_by_source: dict[str, int]
    bad_sources: tuple[str, ...]
    seconds: float


class _Failed(Exception):
    def __init__(self, reason: str, bad: bool = False):
        super().__init__(reason)
        self.reason, self.bad = reason, bad


Pieces = dict[int, tuple[bytes, str]]  # offset -> (bytes, the source that sent them)


@dataclass
class _Fetch:
    endpoint: Endpoint
    handler: str
    digest: str
    size: int
    page_bytes: int
    stall_timeout: float
    on_bytes: Callable[[int], None] | None
    bad: list[str] = field(default_factory=list)
    dropped: set[str] = field(default_factory=set)
    reasons: dict[str, str] = field(default_factory=dict)

    def excluded(self, source: str) -> bool:
        return source in self.dropped or source in self.bad

    def fail(self, source: str, reason: str, bad: bool) -> None:
        if bad and source not in self.bad:
            self.bad.append(source)
        elif not bad:
            self.dropped.add(source)
        self.reasons.setdefault(source, reason)

    def why(self) -> str:
        return "; ".join(f"{s[-8:]}: {r}" for s, r in self.reasons.items()) or "no source to ask"

    async def ask(self, source: str, start: int, end: int) -> bytes:
        """Bytes ``start ..`` (at most to ``end``) from ``source``; _Failed with the reason."""
        try:
            reply = await asyncio.wait_for(
                self.endpoint.acall(source, self.handler, page_request(self.digest, start)),
                self.stall_timeout,
            )
        except TimeoutError:
            raise _Failed(f"stalled (no page within {self.stall_timeout:g} s)") from None
        except Exception as e:  # unreachable, gone: this source cannot serve it
            raise _Failed(f"{type(e).__name__}: {str(e)[:120]}") from None
        try:
            header, data = read_page(reply)
        except ValueError as e:
            raise _Failed(str(e)) from None
        if "error" in header:
            raise _Failed(str(header["error"])[:200])
        if header.get("size") != self.size:  # the digest fixes the size: a different one is a lie
            raise _Failed(f"announced {header.get('size')!r} bytes, not {self.size}", bad=True)
        if header.get("offset") != start or not data:
            raise _Failed(f"malformed page at offset {start}")
        return data[: end - start]

    async def collect(self, sources: Sequence[str], todo: deque[tuple[int, int]], pieces: Pieces) -> bool:
        """Fill ``pieces`` with every range of ``todo`` from ``sources`` (a few requests in flight at
        each; a failed range goes back to the others). True when every range arrived."""
        changed = asyncio.Condition()
        in_flight = 0

        def ready(source: str) -> bool:  # a range to take, or nothing more for this source to do
            return self.excluded(source) or bool(todo) or in_flight == 0

        async def lane(source: str) -> None:
            nonlocal in_flight
            while True:
                async with changed:
                    await changed.wait_for(partial(ready, source))
                    if self.excluded(source) or not todo:
                        return
                    start, end = todo.popleft()
                    in_flight += 1
                try:
                    data = await self.ask(source, start, end)
                except _Failed as e:
                    self.fail(source, e.reason, e.bad)
                    todo.appendleft((start, end))
                else:
                    pieces[start] = (data, source)
                    if start + len(data) < end:  # a server with smaller pages: the rest is a new range
                        todo.appendleft((start + len(data), end))
                    if self.on_bytes is not None:
                        try:
                            self.on_bytes(len(data))
                        except Exception:  # a progress display must not break a transfer
                            logger.exception("on_bytes callback failed")
                finally:
                    async with changed:
                        in_flight -= 1
                        changed.notify_all()

        live = [s for s in sources if not self.excluded(s)]
        await asyncio.gather(*(lane(s) for s in live for _ in range(IN_FLIGHT_PER_SOURCE)))
        return not todo

    async def matches(self, pieces: Pieces) -> tuple[bytes, bool]:
        data = b"".join(pieces[offset][0] for offset in sorted(pieces))
        digest = await asyncio.to_thread(lambda: hashlib.sha256(data).hexdigest())
        return data, digest == self.digest

    async def run(self, sources: list[str]) -> tuple[bytes, dict[str, int]]:
        pieces: Pieces = {}
        todo = deque((o, min(o + self.page_bytes, self.size)) for o in range(0, self.size, self.page_bytes))
        if not await self.collect(sources, todo, pieces):
            raise ShardUnavailable(f"shard {self.digest[:12]}: no complete copy: {self.why()}")
        data, ok = await self.matches(pieces)
        if ok:
            served: dict[str, int] = {}
            for chunk, source in pieces.values():
                served[source] = served.get(source, 0) + len(chunk)
            return data, served
        # Some source lied; each source in turn completes its own copy until one passes the hash.
        first = dict(pieces)
        own = {s: sum(len(c) for c, src in first.values() if src == s) for s in sources}
        logger.warning(f"shard {self.digest[:12]} assembled from {sum(1 for n in own.values() if n)} "
                       "source(s) failed its hash; checking each source's own copy")  # fmt: skip
        for source in sorted((s for s in sources if not self.excluded(s)), key=lambda s: -own[s]):
            mine: Pieces = {o: p for o, p in first.items() if p[1] == source}
            todo = deque((o, o + len(c)) for o, (c, src) in sorted(first.items()) if src != source)
            if not await self.collect([source], todo, mine):
                continue  # it stalled or erred: dropped, its reason kept
            data, ok = await self.matches(mine)
            if not ok:
                self.fail(source, "served bytes that fail the hash", bad=True)
                continue
            served = {source: self.size}
            for offset, (chunk, src) in first.items():
                if src == source:
                    continue
                if data[offset : offset + len(chunk)] == chunk:
                    served[src] = served.get(src, 0) + len(chunk)
                else:
                    self.fail(src, "served bytes that fail the hash", bad=True)
            return data, served
        raise ShardUnavailable(f"shard {self.digest[:12]}: no source served its right bytes: {self.why()}")


def fetch_shard(
    endpoint: Endpoint,
    sources: Sequence[str],
    digest: str,
    size: int,
    *,
    handler: str = SHARD_HANDLER,
    timeout: float = 120.0,
    stall_timeout: float = 10.0,
    on_bytes: Callable[[int], None] | None = None,
    page_bytes: int = PAGE_BYTES,
    cancel: threading.Event | None = None,
) -> ShardFetch:
    """Shard ``digest`` (``size`` bytes, from the signed manifest) from ``sources`` (peer ids), its
    pages spread over all of them; checked against ``digest``. ShardUnavailable (one line) when no
    source yields the right bytes within ``timeout`` s, or when ``cancel`` is set.

    ``on_bytes(n)`` is called on the endpoint's event-loop thread for every ``n`` bytes received
    (refetched pages included), so it must be quick and thread-safe. ``page_bytes`` is the page size
    asked for; a server with smaller pages is followed, larger pages are cut."""
    started = time.monotonic()
    sources = list(dict.fromkeys(sources))
    if not sources:
        raise ShardUnavailable(f"shard {digest[:12]}: no source to ask")
    if size <= 0:
        raise ShardUnavailable(f"shard {digest[:12]}: size {size} is not positive")
    fetch = _Fetch(endpoint, handler, digest, size, page_bytes, stall_timeout, on_bytes)

    async def bounded() -> tuple[bytes, dict[str, int]]:
        return await asyncio.wait_for(fetch.run(sources), timeout)

    future = asyncio.run_coroutine_threadsafe(bounded(), endpoint.loop.loop)
    deadline = started + timeout + 5.0  # the inner bound fires first; this one guards a stuck loop
    try:
        while True:
            if cancel is not None and cancel.is_set():
                raise ShardUnavailable(f"shard {digest[:12]}: cancelled")
            left = max(0.0, deadline - time.monotonic())
            try:
                data, served = future.result(min(left, 0.25) if cancel is not None else left)
                break
            except TimeoutError:  # the same class for the inner wait_for and for waiting here
                if future.done():
                    raise ShardUnavailable(
                        f"shard {digest[:12]}: no right copy within {timeout:g} s: {fetch.why()}"
                    ) from None
                if time.monotonic() >= deadline:
                    raise ShardUnavailable(f"shard {digest[:12]}: no reply within {timeout:g} s") from None
    finally:
        if not future.done():
            future.cancel()
    return ShardFetch(data, served, tuple(fetch.bad), time.monotonic() - started)
