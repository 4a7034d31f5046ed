"""The aggregator's side of distributed search: online peers evaluate shares of each generation.

``manta-aggregator search`` joins the task's DHT as a client (its own throw-away libp2p identity:
the running aggregator keeps the aggregator's peer id), reads the online peers from their signed
announcements, and runs :func:`supernet.search.run.run_search` with one :class:`RemotePeer` per peer
as helpers. :class:`supernet.search.distributed.DistributedEvaluator` deals each generation's
configs out by hash and merges the answers by hash; a share whose peer fails, refuses or is too slow
is evaluated here instead (the local evaluator is the fallback). Every peer evaluates on the same
fixed validation subset as this process (same checkpoint, same ``val_samples``/``seed``/BN batches,
checked by the peer), so the search's result is the same whether 0, 1 or 10 peers helped.

Requests are signed with the aggregator's Ed25519 identity and name this node's peer id
(:mod:`protocol.evaluation_requests`); peers download the checkpoint from this node in pages
(:class:`CheckpointServer`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hivemind_adapter.dht import read_signed
from hivemind_adapter.p2p import Endpoint
from hivemind_adapter.paged_blobs import BlobServer
from protocol.dht_schema import open_peer_value, peers_key
from protocol.evaluation_requests import checkpoint_handler, evaluate_handler, sign_request
from protocol.identity import Identity
from protocol.pages import PAGE_BYTES
from supernet.search.distributed import read_share_answer, share_request

if TYPE_CHECKING:  # the search modules import torch; only the search itself needs them
    from supernet.search.distributed import SpotChecks

logger = logging.getLogger(__name__)


class PeerFailed(RuntimeError):
    """A peer did not deliver its share (refused, failed, unreachable); it is redone locally."""


def online_peers(dht, task_id: str, aggregator_keys: frozenset[str] | None = None) -> list[str]:
    """Peer ids of the task's members with a valid, not withdrawn announcement, sorted."""
    opened = read_signed(
        dht,
        peers_key(task_id),
        lambda sub, value: open_peer_value(task_id, sub, value, aggregator_keys).announcement,
    )
    return sorted({a.record.peer_id for a in opened if a.record.throughput_milli > 0})  # 0: withdrawn


def wait_for_peers(
    dht, task_id: str, seconds: float, aggregator_keys: frozenset[str] | None = None, settle: float = 2.0
) -> list[str]:
    """The online peers (members certified by one of ``aggregator_keys``, where given), waiting up to
    ``seconds`` for the first; once one is seen, ``settle`` s more for the others (announcements of
    peers that started together arrive within moments)."""
    deadline = time.monotonic() + seconds
    peers = online_peers(dht, task_id, aggregator_keys)
    while not peers and time.monotonic() < deadline:
        time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
        peers = online_peers(dht, task_id, aggregator_keys)
    if peers and seconds > 0:
        time.sleep(min(settle, max(0.0, deadline - time.monotonic())))
        peers = online_peers(dht, task_id, aggregator_keys) or peers
    return peers


class CheckpointServer:
    """Serves one checkpoint file in pages under ``manta/<task>/checkpoint`` (to anyone who names its
    SHA-256: the peers that train the task hold the same weights anyway)."""

    def __init__(self, endpoint: Endpoint, task_id: str, path: Path, page_bytes: int = PAGE_BYTES):
        self._server = BlobServer(
            endpoint,
            checkpoint_handler(task_id),
            page_bytes,
            missing="this node serves no checkpoint with that SHA-256",
        )
        data = Path(path).read_bytes()
        self.sha256 = hashlib.sha256(data).hexdigest()
        self.data = data

    @property
    def data(self) -> bytes:
        return self._data

    @data.setter
    def data(self, value: bytes) -> None:  # what is served under the checkpoint's SHA-256
        self._data = value
        self._server.put(self.sha256, value)

    @property
    def pages(self) -> int:
        return self._server.pages_served

    def close(self) -> None:
        self._server.close()


@dataclass
class SearchLink:
    """What every request of one search shares: this node, the aggregator's key, the checkpoint and
    the evaluator every peer must build."""

    endpoint: Endpoint
    identity: Identity
    task_id: str
    checkpoint: dict[str, Any]  # sha256, size, digest, round
    evaluator: dict[str, int]  # evaluator_arguments()
    settings: dict[str, Any]  # the local evaluator's settings plus the checkpoint digest

    @property
    def peer_id(self) -> str:
        return self.endpoint.peer_id

    def call(self, peer_id: str, payload: bytes, timeout: float) -> dict:
        return json.loads(self.endpoint.call(peer_id, evaluate_handler(self.task_id), payload, timeout))


@dataclass
class RemotePeer:
    """An evaluator whose ``evaluate(configs)`` is one online peer's answer to a signed request."""

    link: SearchLink
    peer_id: str
    timeout: float
    configs: int = 0  # evaluated by the peer (answers accepted)
    redone: int = 0  # configs of failed shares (evaluated locally instead)
    last: str = ""  # what happened to the last share, for the progress line
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def name(self) -> str:
        return self.peer_id[-8:]

    def evaluate(self, configs) -> dict[str, float]:

        started = time.perf_counter()
        try:
            wire = sign_request(
                self.link.identity,
                task_id=self.link.task_id,
                requester=self.link.peer_id,
                peer=self.peer_id,
                checkpoint=self.link.checkpoint,
                evaluator=self.link.evaluator,
                share=share_request(configs, self.link.settings),
            )
            try:
                reply = self.link.call(self.peer_id, wire, self.timeout)
            except Exception as e:  # unreachable, timed out, the connection dropped
                raise PeerFailed(f"no answer ({type(e).__name__}: {str(e)[:120] or 'timeout'})") from None
            if reply.get("status") != "ok":
                raise PeerFailed(f"{reply.get('status', 'error')}: {reply.get('detail', '')}")
            results = read_share_answer(reply["answer"])
        except Exception as e:
            with self._lock:
                self.redone += len(configs)
                self.last = f"{len(configs)} redone locally ({e})"
            raise
        with self._lock:
            self.configs += len(configs)
            self.last = f"{len(configs)} in {time.perf_counter() - started:.1f} s"
        return results


def progress_map(
    helpers: list[RemotePeer],
    pool: ThreadPoolExecutor,
    say: Callable[[str], None],
    checks: SpotChecks | None = None,
):
    """A ``map_fn`` for :class:`DistributedEvaluator`: the shares in parallel, then one line per
    generation saying which peer evaluated how many configs (and, with ``checks``, how many of its
    values were spot-checked so far, and whether it is untrusted)."""
    batches = [0]

    def run(fn: Callable[[Any], Any], items: Iterable[Any]) -> list[Any]:
        items = list(items)
        for h in helpers:
            h.last = "no share"
        results = list(pool.map(fn, items))
        total = sum(len(share) for _, share in items)
        parts = [f"{h.name}: {h.last}{_checked(checks, i)}" for i, h in enumerate(helpers)]
        say(f"generation {batches[0]}: {total} configs over {len(helpers)} peer(s) — " + "; ".join(parts))
        batches[0] += 1
        return results

    return run


def _checked(checks: SpotChecks | None, index: int) -> str:
    if checks is None or checks.fraction <= 0:
        return ""
    found = checks.of(index)
    if found["untrusted"]:
        return f" (UNTRUSTED: {found['mismatches']} wrong value(s); {found['discarded']} redone locally)"
    return f" ({found['verified']} verified)"
