"""Recent committed training states, kept by digest and served in pages (``manta/<task>/state``).

Every peer keeps the states its last few committed rounds produced. Whoever needs one exact state
(the aggregator, for the start state of a receipt it audits and for its checkpoints) asks the peers
that held it for it by digest and checks what arrives against that digest: nobody polls, nobody
downloads a state it will not use, and a state is never taken on its server's word.

A state travels as its round and averaging attempt (two little-endian int64), then the raw bytes of
its tensors in the task's fixed layout (:mod:`supernet.state`), concatenated; the receiver knows the
layout from the task, so shapes and dtypes never travel. The digest covers the tensors; round and
attempt are the server's word (the requester knows the round from what made it ask).

A state's *head* (its first tensors: the workers' parameters, all an audit replays from) is also
served alone: whoever fetches the state's index (the hash of each tensor, checked against the
digest) fetches and checks the head without the rest (:func:`fetch_state_head`), a seventh of an
outer task's state.
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
from protocol.handler_names import state_handler, state_head_handler, state_index_handler
from supernet.state import digest, digest_of_index, tensor_hashes

KEEP_STATES = 8  # an audit looks about three rounds back; checkpoints want the newest
_HEADER = struct.Struct("<qq")  # round, attempt
_HASH_BYTES = 32


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
    """The states of this node's last :data:`KEEP_STATES` committed rounds, served by digest, each
    with its index and its head (the leading ``head`` tensors) served alone."""

    def __init__(self, endpoint: Endpoint, task_id: str, head: int, keep: int = KEEP_STATES):
        self.keep, self.head = keep, head
        self._order: OrderedDict[str, tuple[int, str]] = OrderedDict()  # digest -> (round, head key)
        self._lock = threading.Lock()
        self._server = BlobServer(endpoint, state_handler(task_id))
        self._index_server = BlobServer(endpoint, state_index_handler(task_id))
        self._head_server = BlobServer(endpoint, state_head_handler(task_id))

    def add(
        self, round_index: int, attempt: int, state_digest: str, tensors: list[torch.Tensor], consensus: int
    ) -> None:
        """Keep ``tensors`` (whose leading ``consensus`` hash to ``state_digest``) and serve them."""
        index = tensor_hashes(tensors[:consensus])
        head_key = digest_of_index(index[: self.head])
        encoded = encode_state(round_index, attempt, tensors)
        head_bytes = state_bytes(tensors[: self.head])
        self._server.put(state_digest, encoded)
        self._index_server.put(state_digest, b"".join(index))
        self._head_server.put(head_key, memoryview(encoded)[:head_bytes])  # a prefix: no copy
        with self._lock:
            self._order[state_digest] = (round_index, head_key)
            self._order.move_to_end(state_digest)
            while len(self._order) > self.keep:
                old, (_, old_head) = self._order.popitem(last=False)
                self._server.drop(old)
                self._index_server.drop(old)
                if all(head != old_head for _, head in self._order.values()):
                    self._head_server.drop(old_head)

    def digests(self) -> dict[str, int]:
        with self._lock:
            return {d: round_index for d, (round_index, _) in self._order.items()}

    @property
    def bytes_served(self) -> int:
        return self._server.bytes_served + self._index_server.bytes_served + self._head_server.bytes_served

    def close(self) -> None:
        self._server.close()
        self._index_server.close()
        self._head_server.close()


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
        _refuse_non_finite(tensors)  # outside the digest (batch-norm statistics): a holder's own
        return ArchivedState(round_index, attempt, got, tensors)

    size = state_bytes(template)
    return fetch_spread(
        endpoint, sources, state_handler(task_id), state_digest, check, timeout, size, size, partial
    )


def fetch_state_head(
    endpoint: Endpoint,
    sources: Iterable[str],
    task_id: str,
    state_digest: str,
    head_template: list[torch.Tensor],
    consensus: int,
    timeout: float = 30.0,
    partial: dict[int, bytes] | None = None,
) -> ArchivedState:
    """The leading ``len(head_template)`` tensors of the state ``state_digest`` (whose digest covers
    ``consensus`` tensors), without the rest: its index from any of ``sources`` (checked against the
    digest), then the head's pages spread over them (each tensor checked against the index, every
    value finite). The result's ``digest`` is the head's own. BlobUnavailable says why not."""
    sources = list(sources)

    def check_index(blob: bytes) -> list[bytes]:
        if len(blob) != consensus * _HASH_BYTES or digest_of_index(_split(blob)) != state_digest:
            raise ValueError(f"served an index that is not state {state_digest[:12]}'s")
        return _split(blob)

    index_bytes = consensus * _HASH_BYTES
    index = fetch_spread(
        endpoint, sources, state_index_handler(task_id), state_digest, check_index, timeout,
        index_bytes, index_bytes,
    )  # fmt: skip
    wanted = index[: len(head_template)]
    head_key = digest_of_index(wanted)

    def check_head(blob: bytes) -> ArchivedState:
        round_index, attempt, tensors = decode_state(blob, head_template)
        if tensor_hashes(tensors) != wanted:
            raise ValueError(f"served a head that is not state {state_digest[:12]}'s")
        _refuse_non_finite(tensors)
        return ArchivedState(round_index, attempt, head_key, tensors)

    size = state_bytes(head_template)
    return fetch_spread(
        endpoint, sources, state_head_handler(task_id), head_key, check_head, timeout, size, size, partial
    )


def _refuse_non_finite(tensors: list[torch.Tensor]) -> None:
    if not all(torch.isfinite(t).all() for t in tensors if t.is_floating_point()):
        raise ValueError("served a state with non-finite values")


def _split(index: bytes) -> list[bytes]:
    return [index[i : i + _HASH_BYTES] for i in range(0, len(index), _HASH_BYTES)]
