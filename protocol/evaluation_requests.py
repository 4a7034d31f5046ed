"""Signed requests for distributed search evaluation.

The aggregator's search (``manta-aggregator search``) asks online peers to evaluate sub-network
configs on a checkpoint (``manta/<task>/evaluate``); each peer first downloads that checkpoint from the
requester (``manta/<task>/checkpoint``). The search runs in its own process with a throw-away libp2p
identity (the running aggregator owns the aggregator's peer id), so a peer cannot recognise the
aggregator by its transport peer id. It recognises it by its Ed25519 key instead: the request is
signed by a key the TaskSpec lists in ``aggregator_keys``, and the signed body names

- the task id (a request for another task is refused),
- the requester's transport peer id (so a captured request cannot be replayed from another node:
  the peer compares it with the peer id the transport authenticated),
- the peer it is meant for, and a timestamp (stale requests are refused),
- the checkpoint (SHA-256 of the file, its size, and its state digest), the evaluator's arguments
  and the share itself (:func:`supernet.search.distributed.share_request`).

Wire form of a request: ``manta/evaluate/v1\\n<body JSON>\\ned25519 <public key hex> <signature hex>``,
the signature covering the first two lines (the same framing as sealed records, but the body is not a
pydantic record: it carries a list of configs of any length up to :data:`MAX_REQUEST_BYTES`).

The checkpoint travels in pages (:mod:`protocol.pages`), keyed by the file's SHA-256.

Pure Python, no torch, no hivemind: both the peer and the aggregator import it.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from protocol.identity import Identity, verify_signature

__all__ = [
    "MAX_AGE_MS",
    "RequestRefused",
    "checkpoint_handler",
    "evaluate_handler",
    "file_sha256",
    "open_request",
    "sign_request",
]

PREFIX = b"manta/evaluate/v1"
MAX_REQUEST_BYTES = 2 * 1024 * 1024  # far below the 4 MiB message limit; ~10,000 configs
MAX_AGE_MS = 10 * 60 * 1000  # requests older (or further ahead) than this are refused: clocks drift

_TRAILER = re.compile(rb"ed25519 ([0-9a-f]{64}) ([0-9a-f]{128})")
_HEX64 = re.compile(r"[0-9a-f]{64}")


def evaluate_handler(task_id: str) -> str:
    return f"manta/{task_id}/evaluate"


def checkpoint_handler(task_id: str) -> str:
    return f"manta/{task_id}/checkpoint"


class RequestRefused(ValueError):
    """A request this peer will not serve; the message is the one-line reason sent back."""


def sign_request(
    identity: Identity,
    *,
    task_id: str,
    requester: str,
    peer: str,
    checkpoint: Mapping[str, Any],
    evaluator: Mapping[str, Any],
    share: Mapping[str, Any],
    timestamp_ms: int | None = None,
) -> bytes:
    """The wire bytes of an evaluation request signed by ``identity`` (see the module docstring).

    ``checkpoint``: ``{"sha256", "size", "digest", "round"}``; ``evaluator``: the arguments the peer
    builds its evaluator with (``val_samples``, ``bn_batches``, ``seed``); ``share``: a share request.
    """
    body = {
        "task_id": task_id,
        "requester": requester,
        "peer": peer,
        "timestamp": int(time.time() * 1000) if timestamp_ms is None else int(timestamp_ms),
        "checkpoint": dict(checkpoint),
        "evaluator": dict(evaluator),
        "share": dict(share),
    }
    message = PREFIX + b"\n" + json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    signature = identity.sign(message)
    wire = message + b"\ned25519 " + identity.public_key.hex().encode() + b" " + signature.hex().encode()
    if len(wire) > MAX_REQUEST_BYTES:
        raise ValueError(f"evaluation request is {len(wire)} bytes, over {MAX_REQUEST_BYTES}")
    return wire


def open_request(
    wire: bytes,
    *,
    task_id: str,
    aggregator_keys: Iterable[str],
    sender: str,
    me: str,
    now_ms: int | None = None,
    max_age_ms: int = MAX_AGE_MS,
) -> dict[str, Any]:
    """The checked body of a request from transport peer ``sender`` to this peer ``me``.

    Raises :class:`RequestRefused` (one line) unless the request is well-formed, signed by one of
    ``aggregator_keys`` (hex), for ``task_id``, sent by the peer it names as requester, meant for
    ``me`` and fresh; the checks run cheapest first, the signature before anything is parsed.
    """
    if not isinstance(wire, bytes) or len(wire) > MAX_REQUEST_BYTES:
        raise RequestRefused("malformed request: not bytes, or over the size limit")
    message, newline, trailer = wire.rpartition(b"\n")
    head, _, body_bytes = message.partition(b"\n")
    found = _TRAILER.fullmatch(trailer)
    if not newline or head != PREFIX or found is None:
        raise RequestRefused(
            f"malformed request: expected {PREFIX.decode()}, a JSON body and a signature line"
        )
    key_hex = found.group(1).decode()
    if key_hex not in set(aggregator_keys):
        raise RequestRefused(f"not signed by an aggregator of task {task_id} (key {key_hex[:16]})")
    if not verify_signature(bytes.fromhex(key_hex), message, bytes.fromhex(found.group(2).decode())):
        raise RequestRefused("the signature does not verify")
    try:
        body = json.loads(body_bytes)
    except ValueError:
        raise RequestRefused("malformed request: the body is not JSON") from None
    if not isinstance(body, dict):
        raise RequestRefused("malformed request: the body is not a JSON object")
    for field, kind in (("task_id", str), ("requester", str), ("peer", str), ("timestamp", int),
                        ("checkpoint", dict), ("evaluator", dict), ("share", dict)):  # fmt: skip
        if not isinstance(body.get(field), kind):
            raise RequestRefused(f"malformed request: {field} missing or of the wrong type")
    if body["task_id"] != task_id:
        raise RequestRefused(f"a request for task {body['task_id']!r}, this peer trains {task_id!r}")
    if body["requester"] != sender:
        raise RequestRefused("the request names another requester than the node that sent it")
    if body["peer"] != me:
        raise RequestRefused("the request is meant for another peer")
    now = int(time.time() * 1000) if now_ms is None else now_ms
    if abs(now - body["timestamp"]) > max_age_ms:
        raise RequestRefused(f"stale request (timestamp {(now - body['timestamp']) / 1000:.0f} s off)")
    checkpoint = body["checkpoint"]
    if not (
        isinstance(checkpoint.get("sha256"), str)
        and _HEX64.fullmatch(checkpoint["sha256"])
        and isinstance(checkpoint.get("size"), int)
        and checkpoint["size"] > 0
        and isinstance(checkpoint.get("digest"), str)
    ):
        raise RequestRefused("malformed request: checkpoint needs sha256, size and digest")
    body["aggregator_key"] = key_hex
    return body


def file_sha256(path: Path) -> tuple[str, int]:
    """SHA-256 (hex) and size of a file, read page by page."""
    h, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
            size += len(block)
    return h.hexdigest(), size
