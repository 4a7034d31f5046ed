"""Blobs served in pages over libp2p (:mod:`protocol.pages`), and fetched from whoever holds them.

A :class:`BlobServer` answers one handler name for a set of blobs, each under a 64-hex key; blobs
are added and removed while it runs (a lock guards the dict, never a whole request). :func:`fetch_blob`
assembles one blob from a source page by page and lets the caller check the whole against its key;
:func:`fetch_from_any` tries several sources in turn. Every call is bounded by its timeout.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

from hivemind_adapter.p2p import Endpoint
from protocol.pages import PAGE_BYTES, error_page, page_request, parse_page_request, read_page, write_page


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
