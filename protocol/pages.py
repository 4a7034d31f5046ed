"""The pages a large blob (a checkpoint file, a training state) travels in between two nodes.

hivemind's unary p2p messages go through the daemon's persistent connection, whose limit is 4 MiB
per message (``persistent_conn_max_msg_size``; hivemind itself streams anything over 2 MiB), so a blob
of any size travels in pages of :data:`PAGE_BYTES`: a request names the blob's key (the SHA-256 of a
file, the digest of a state) and an offset; a reply is a one-line JSON header (total size, offset)
and the raw bytes, or a header with ``error`` alone. Whoever asks checks what it assembles against
the key; a page says nothing about its own integrity.

Pure Python, no torch, no hivemind.
"""

from __future__ import annotations

import json
import re
from typing import Any

PAGE_BYTES = 1024 * 1024  # one page; a reply stays well under the 4 MiB message limit
_KEY = re.compile(r"^[0-9a-f]{64}$")


def page_request(key: str, offset: int) -> bytes:
    return json.dumps({"key": key, "offset": int(offset)}).encode()


def parse_page_request(payload: bytes) -> tuple[str, int]:
    """``(key, offset)``; ValueError for anything else."""
    try:
        ask = json.loads(payload)
        key, offset = ask["key"], ask["offset"]
    except (ValueError, KeyError, TypeError):
        raise ValueError("malformed page request") from None
    if not isinstance(key, str) or not _KEY.match(key) or not isinstance(offset, int) or offset < 0:
        raise ValueError("malformed page request")
    return key, offset


def write_page(total: int, offset: int, data: bytes) -> bytes:
    """One page as sent: a JSON header line, then the raw bytes."""
    return json.dumps({"size": total, "offset": offset}).encode() + b"\n" + data


def read_page(reply: bytes) -> tuple[dict[str, Any], bytes]:
    """``(header, data)`` of a :func:`write_page` reply; an error reply has ``header["error"]``."""
    header, newline, data = reply.partition(b"\n")
    try:
        parsed = json.loads(header)
    except ValueError:
        parsed = None
    if not newline or not isinstance(parsed, dict):
        raise ValueError("page: malformed reply")
    return parsed, data


def error_page(detail: str) -> bytes:
    """A page reply that carries only an error (the node does not hold that blob, ...)."""
    return json.dumps({"error": detail}).encode() + b"\n"
