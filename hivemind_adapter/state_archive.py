"""Recent committed training states, kept by digest and served in pages (``manta/<task>/state``).

Every peer keeps the states its last few committed rounds produced. Whoever needs one exact state
(the aggregator, for the start state of a receipt it audits and for its checkpoints) asks the peers
that held it for it by digest and checks what arrives against that digest: nobody polls, nobody
downloads a state it will not use, and a state is never taken on its server's word.

A state travels as its round and averaging attempt (two little-endian int64), then the raw bytes of
its tensors in the task's fixed layout (:mod:`supernet.state`), concatenated; the receiver knows the
layout from the task, so shapes and dtypes never travel. The digest covers the tensors; round and
attempt are the server's word (the requester knows the round from what made it ask).
"""

from __future__ import annotations

import struct
import threading
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import torch

from hivemind_adapter.p2p import Endpoint
from hivemind_adapter.paged_blobs import BlobServer, fetch_spread
from protocol.dht_schema import state_handler
from supernet.state import digest

KEEP_STATES = 8  # an audit looks about three rounds back; checkpoints want the newest
_HEADER = struct.Struct("<qq")  # round, attempt


@dataclass(frozen=True)
class ArchivedState:
    round: int
    attempt: int
    digest: str
    tensors: list[torch.Tensor]


def encode_state(round_index: int, attempt: int, tensors: list[torch.Tensor]) -> bytes:
    body = b"".join(t.detach().cpu().contiguous().numpy().tobytes() for t in tensors)
    return _HEADER.pack(round_index, attempt) + body


def state_bytes(template: list[torch.Tensor]) -> int:
    return _HEADER.size + sum(t.numel() * t.element_size() for t in template)


def decode_state(data: bytes, template: list[torch.Tensor]) -> tuple[int, int, list[torch.Tensor]]:
    """(round, attempt, tensors shaped like ``template``) from :func:`encode_state`'s bytes;
    ValueError if they do not fit."""
    expected = state_bytes(template)
    if len(data) != expected:
        raise ValueError(f"a state of this task has {expected} bytes, got {len(data)}")
    round_index, attempt = _HEADER.unpack_from(data)
    out, offset = [], _HEADER.size
    for t in template:
        n = t.numel() * t.element_size()
        array = np.frombuffer(data, dtype=t.numpy().dtype, count=t.numel(), offset=offset)
        out.append(torch.from_numpy(array.copy()).reshape(t.shape))
        offset += n
    return round_index, attempt, out


class StateArchive:
    """The states of this node's last :data:`KEEP_STATES` committed rounds, served by digest."""

    def __init__(self, endpoint: Endpoint, task_id: str, keep: int = KEEP_STATES):
        self.keep = keep
        self._order: OrderedDict[str, int] = OrderedDict()  # digest -> round, oldest first
        self._lock = threading.Lock()
        self._server = BlobServer(endpoint, state_handler(task_id))

    def add(self, round_index: int, attempt: int, state_digest: str, tensors: list[torch.Tensor]) -> None:
        self._server.put(state_digest, encode_state(round_index, attempt, tensors))
        with self._lock:
            self._order[state_digest] = round_index
            self._order.move_to_end(state_digest)
            while len(self._order) > self.keep:
                old, _ = self._order.popitem(last=False)
                self._server.drop(old)

    def digests(self) -> dict[str, int]:
        with self._lock:
            return dict(self._order)

    @property
    def bytes_served(self) -> int:
        return self._server.bytes_served

    def close(self) -> None:
        self._server.close()


def fetch_state(
    endpoint: Endpoint,
    sources: Iterable[str],
    task_id: str,
    state_digest: str,
    template: list[torch.Tensor],
    consensus: int,
    timeout: float = 30.0,
    partial: dict[int, bytes] | None = None,
) -> ArchivedState:
    """The state with digest ``state_digest``, its pages spread over every one of ``sources`` that
    holds it (checked: its leading ``consensus`` tensors must hash to that digest, and every value
    must be finite; a wrong copy is found by trying each holder's own). BlobUnavailable says why not.
    ``partial``: pages kept from an earlier try of this digest (:func:`fetch_spread`)."""

    def check(blob: bytes) -> ArchivedState:
        round_index, attempt, tensors = decode_state(blob, template)
        got = digest(tensors[:consensus])
        if got != state_digest:
            raise ValueError(f"served a state with digest {got[:12]}, not {state_digest[:12]}")
        # outside the digest (batch-norm statistics): a holder's own, never loaded if not finite
        if not all(torch.isfinite(t).all() for t in tensors if t.is_floating_point()):
            raise ValueError("served a state with non-finite values")
        return ArchivedState(round_index, attempt, got, tensors)

    size = state_bytes(template)
    return fetch_spread(
        endpoint, sources, state_handler(task_id), state_digest, check, timeout, size, size, partial
    )
