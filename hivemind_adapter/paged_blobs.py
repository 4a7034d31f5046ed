"""Blobs served in pages over libp2p (:mod:`protocol.pages`), and fetched from whoever holds them.

A :class:`BlobServer` answers one handler name for a set of blobs, each under a 64-hex key; blobs
are added and removed while it runs (a lock guards the dict, never a whole request). :func:`fetch_blob`
assembles one blob from a source page by page and lets the caller check the whole against its key;
:func:`fetch_from_any` tries several sources in turn; :func:`fetch_spread` asks every source at once,
a page each, so a blob held by k nodes arrives at up to k times one node's upload rate (on the open
internet a joiner's download is bounded by its server's uplink, not by its own link). Every call is
bounded by its timeout.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from hivemind_adapter.p2p import Endpoint
from protocol.pages import PAGE_BYTES, error_page, page_request, parse_page_request, read_page, write_page

logger = logging.getLogger(__name__)

IN_FLIGHT_PER_SOURCE = 4  # page requests outstanding at each source at once


class BlobUnavailable(RuntimeError):
    """No source served the blob, or what arrived failed its check; says why."""


class BlobServer:
    def __init__(
        self,
        endpoint: Endpoint,
        handler: str,
        page_bytes: int = PAGE_BYTES,
        missing: str = "this node does not hold that blob",
    ):
        self.endpoint, self.handler, self.page_bytes, self.missing = endpoint, handler, page_bytes, missing
        self._blobs: dict[str, bytes] = {}
        self._lock = threading.Lock()
        self.pages_served = 0
        self.bytes_served = 0
        endpoint.serve(handler, self._handle)

    def put(self, key: str, data: bytes) -> None:
        with self._lock:
            self._blobs[key] = data

    def drop(self, key: str) -> None:
        with self._lock:
            self._blobs.pop(key, None)

    async def _handle(self, payload: bytes, sender: str) -> bytes:
        try:
            key, offset = parse_page_request(payload)
        except ValueError as e:
            return error_page(str(e))
        with self._lock:
            data = self._blobs.get(key)
        if data is None:
            return error_page(self.missing)
        if not 0 <= offset < len(data):
            return error_page(f"offset {offset} outside the blob ({len(data)} bytes)")
        page = data[offset : offset + self.page_bytes]
        self.pages_served += 1
        self.bytes_served += len(page)
        return write_page(len(data), offset, page)

    def close(self) -> None:
        self.endpoint.unserve(self.handler)


def fetch_blob(
    endpoint: Endpoint, source: str, handler: str, key: str, timeout: float, max_bytes: int
) -> bytes:
    """Every page of blob ``key`` from node ``source`` (each page within ``timeout`` s). Raises
    BlobUnavailable with the reason; the caller checks the content against the key."""
    parts, offset, size = [], 0, None
    while size is None or offset < size:
        try:
            header, data = read_page(endpoint.call(source, handler, page_request(key, offset), timeout))
        except Exception as e:  # unreachable, gone, timed out, malformed: this source cannot serve it
            raise BlobUnavailable(f"{source[-8:]}: {type(e).__name__}: {str(e)[:120]}") from None
        if "error" in header:
            raise BlobUnavailable(f"{source[-8:]}: {header['error']}")
        if size is None:
            size = header.get("size")
            if not isinstance(size, int) or not 0 < size <= max_bytes:
                raise BlobUnavailable(f"{source[-8:]}: announced {size!r} bytes (at most {max_bytes})")
        if header.get("size") != size or header.get("offset") != offset or not data:
            raise BlobUnavailable(f"{source[-8:]}: pages do not fit together")
        parts.append(data)
        offset += len(data)
    return b"".join(parts)


def fetch_from_any(
    endpoint: Endpoint,
    sources: Iterable[str],
    handler: str,
    key: str,
    check: Callable[[bytes], Any],
    timeout: float,
    max_bytes: int,
) -> Any:
    """``check(blob)`` of the first source whose blob passes it (check raises ValueError otherwise)."""
    reasons = []
    for source in sources:
        try:
            return check(fetch_blob(endpoint, source, handler, key, timeout, max_bytes))
        except BlobUnavailable as e:
            reasons.append(str(e))
        except ValueError as e:
            reasons.append(f"{source[-8:]}: {e}")
    raise BlobUnavailable("; ".join(reasons) or "no source to ask")


async def _ask_page(
    endpoint: Endpoint, source: str, handler: str, key: str, offset: int, timeout: float
) -> tuple[int, bytes]:
    """``(blob size, page)`` at ``offset`` from ``source``; BlobUnavailable with the reason."""
    try:
        reply = await asyncio.wait_for(endpoint.acall(source, handler, page_request(key, offset)), timeout)
        header, data = read_page(reply)
    except Exception as e:  # unreachable, gone, timed out, malformed: this source cannot serve it
        raise BlobUnavailable(f"{source[-8:]}: {type(e).__name__}: {str(e)[:120]}") from None
    if "error" in header:
        raise BlobUnavailable(f"{source[-8:]}: {header['error']}")
    size = header.get("size")
    if not isinstance(size, int) or header.get("offset") != offset or not data:
        raise BlobUnavailable(f"{source[-8:]}: malformed page at offset {offset}")
    return size, data


async def _gather_spread(
    endpoint: Endpoint,
    sources: list[str],
    handler: str,
    key: str,
    timeout: float,
    max_bytes: int,
    size: int | None,
    pages: dict[int, bytes],
) -> tuple[bytes, dict[str, int]]:
    """The blob's bytes, its pages asked of every source at once (a few requests in flight at each;
    a source that fails is dropped and its page goes back to the others), and pages per source.
    ``pages`` (offset -> bytes) holds what arrived, before (only the rest is asked) and after."""
    reasons: list[str] = []
    if size is None:
        pages.clear()  # pages of an earlier try are kept only where the size is known
    served = {source: 0 for source in sources}
    holders = list(sources)
    if size is None:  # the first page that arrives fixes the size (and the page length) for everyone
        queue = deque(sources)
        while queue and not pages:
            source = queue.popleft()
            try:
                size, first = await _ask_page(endpoint, source, handler, key, 0, timeout)
            except BlobUnavailable as e:
                reasons.append(str(e))
                continue
            if not 0 < size <= max_bytes:
                reasons.append(f"{source[-8:]}: announced {size} bytes (at most {max_bytes})")
                continue
            pages[0], served[source], stride = first, 1, len(first)
            holders = [source, *queue]
        if not pages:
            raise BlobUnavailable("; ".join(dict.fromkeys(reasons)) or "no source to ask")
    else:  # known in advance (a state's size follows from the task): every page is asked at once
        stride = PAGE_BYTES
    todo = deque(offset for offset in range(0, size, stride) if offset not in pages)
    wanted = len(range(0, size, stride))

    async def lane(source: str) -> None:
        while len(pages) < wanted:
            if not todo:  # the rest is in flight elsewhere; its page comes back here if that fails
                await asyncio.sleep(0.01)
                continue
            offset = todo.popleft()
            try:
                total, data = await _ask_page(endpoint, source, handler, key, offset, timeout)
                if total != size or len(data) != min(stride, size - offset):
                    raise BlobUnavailable(f"{source[-8:]}: its pages do not fit the others'")
            except BlobUnavailable as e:
                todo.appendleft(offset)
                reasons.append(str(e))
                return
            pages[offset] = data
            served[source] += 1

    # Several requests in flight at each source keep its link busy across round trips (one at a
    # time leaves it idle for a round trip per page).
    await asyncio.gather(*(lane(source) for source in holders for _ in range(IN_FLIGHT_PER_SOURCE)))
    if len(pages) < wanted:
        missing = f"{wanted - len(pages)} of {wanted} pages unavailable: "
        raise BlobUnavailable(missing + "; ".join(dict.fromkeys(reasons)))
    return b"".join(pages[offset] for offset in sorted(pages)), served


def fetch_spread(
    endpoint: Endpoint,
    sources: Iterable[str],
    handler: str,
    key: str,
    check: Callable[[bytes], Any],
    timeout: float,
    max_bytes: int,
    size: int | None = None,
    partial: dict[int, bytes] | None = None,
) -> Any:
    """``check(blob)`` of the blob assembled from pages of every source at once (each page within
    ``timeout`` s; ``size``: the exact size, if the caller knows it, so no page waits for a first).
    ``partial``: the pages an earlier try of the same ``key`` and ``size`` left there (only the rest
    is asked), filled with what arrives: a try that fails on a congested link loses no page.
    If the whole fails its check, some source served a wrong page: each source's own copy is then
    tried in turn (:func:`fetch_from_any`), so one liar costs time, never the blob."""
    sources = list(dict.fromkeys(sources))
    pages = math.ceil(max_bytes / PAGE_BYTES) + 1
    bound = timeout * (pages + len(sources) + 1)  # every request is bounded; so is their sum
    got: dict[int, bytes] = partial if partial is not None else {}
    future = asyncio.run_coroutine_threadsafe(
        _gather_spread(endpoint, sources, handler, key, timeout, max_bytes, size, got), endpoint.loop.loop
    )
    try:
        blob, served = future.result(bound)
    except TimeoutError:
        future.cancel()
        raise BlobUnavailable(f"no complete copy of {key[:12]} within {bound:.0f} s") from None
    got.clear()  # complete: a next try starts afresh
    try:
        return check(blob)
    except ValueError as e:
        logger.warning(f"blob {key[:12]} assembled from {len(served)} source(s) failed its check ({e}); "
                       "trying each source's own copy")  # fmt: skip
    return fetch_from_any(
        endpoint, [s for s in sources if s in served], handler, key, check, timeout, max_bytes
    )
