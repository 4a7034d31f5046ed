"""A peer's share of the aggregator's sub-network search: ``manta/<task>/evaluate``.

``manta-aggregator search`` spreads each generation's candidate evaluations over the online peers
(:mod:`supernet.search.distributed`). A peer serves a request only if it is signed by one of the
TaskSpec's ``aggregator_keys`` and names the node that sent it (:func:`protocol.evaluation_requests.
open_request`); anything else is refused with the reason. Then, in one worker thread (one evaluation
at a time; the training workers are separate processes and keep training meanwhile, the agent's
torch runs on one thread):

1. the checkpoint the request names is taken from ``<data dir>/search-checkpoints/<sha256>.pt`` or
   downloaded from the requester in pages (``manta/<task>/checkpoint``), its SHA-256 and size checked
   before it is kept, and its state digest checked against the request's when it is loaded;
2. the evaluator is built with exactly the requested arguments (validation subset size and seed, BN
   batches) and its settings plus the checkpoint digest must equal the settings in the request —
   the same fixed validation subset on every peer, so the value of a config does not depend on who
   computed it;
3. the answer is :func:`supernet.search.distributed.answer_share`'s, as JSON.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from hivemind_adapter.p2p import Endpoint
from hivemind_adapter.paged_blobs import BlobUnavailable, fetch_blob
from protocol.evaluation_requests import (
    RequestRefused,
    checkpoint_handler,
    evaluate_handler,
    file_sha256,
    open_request,
)
from supernet.checkpoint import CheckpointError, load_checkpoint
from supernet.search.distributed import answer_share

logger = logging.getLogger(__name__)

KEEP_CHECKPOINTS = 2  # cached search checkpoints per peer (older ones are deleted)


def fetch_checkpoint(
    endpoint: Endpoint, source: str, task_id: str, sha256: str, size: int, dest: Path, timeout: float = 60.0
) -> Path:
    """Download the checkpoint ``sha256`` from node ``source`` into ``dest`` (atomically), page by page.
    Raises :class:`RequestRefused` if the source does not serve it, or what arrives has another size
    or hash."""
    try:
        data = fetch_blob(endpoint, source, checkpoint_handler(task_id), sha256, timeout, max_bytes=size)
    except BlobUnavailable as e:
        raise RequestRefused(f"checkpoint download refused by the requester: {e}") from None
    if len(data) != size:
        raise RequestRefused("checkpoint download: the pages do not match the requested size")
    got = hashlib.sha256(data).hexdigest()
    if got != sha256:
        raise RequestRefused(f"checkpoint download: SHA-256 mismatch (got {got[:16]})")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.{threading.get_ident()}.part")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    return dest


class EvaluationService:
    """Serves ``manta/<task>/evaluate`` on the peer's libp2p daemon (see the module docstring)."""

    def __init__(
        self,
        endpoint: Endpoint,
        task_id: str,
        aggregator_keys: tuple[str, ...],
        data_dir: Path,
        validation_task: Callable[[], Any] | None = None,
    ):
        self.endpoint, self.task_id, self.keys = endpoint, task_id, tuple(aggregator_keys)
        # a task on an operator's dataset: its validation shards, fetched from the swarm when asked
        self.validation_task = validation_task
        self.cache = Path(data_dir) / "search-checkpoints"
        self.peer_id = endpoint.peer_id
        self.counters = {"served": 0, "configs": 0, "refused": 0, "failed": 0}
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="manta-evaluate")
        self._loaded: dict[str, Any] = {}  # sha256 -> LoadedCheckpoint (only the last one is kept)
        self._evaluators: dict[tuple[str, str], Any] = {}
        endpoint.serve(evaluate_handler(task_id), self._handle)

    async def _handle(self, payload: bytes, sender: str) -> bytes:
        try:
            body = open_request(
                payload, task_id=self.task_id, aggregator_keys=self.keys, sender=sender, me=self.peer_id
            )
            answer = await asyncio.get_running_loop().run_in_executor(self._executor, self._evaluate, body)
            reply = {"status": "ok", "answer": answer}
        except RequestRefused as e:
            self.counters["refused"] += 1
            logger.info(f"evaluation request from {sender[-8:]} refused: {e}")
            reply = {"status": "refused", "detail": str(e)}
        except Exception as e:  # a failed evaluation must not take the handler down; the requester redoes it
            self.counters["failed"] += 1
            logger.warning(f"evaluation for {sender[-8:]} failed: {type(e).__name__}: {e}")
            reply = {"status": "error", "detail": f"{type(e).__name__}: {e}"}
        return json.dumps(reply).encode()

    def _evaluate(self, body: dict) -> dict:

        loaded = self._checkpoint(body["checkpoint"], body["requester"])
        arguments = json.dumps(body["evaluator"], sort_keys=True)
        key = (body["checkpoint"]["sha256"], arguments)
        if key not in self._evaluators:
            from supernet.search.distributed import evaluator_from_arguments

            try:
                evaluator = evaluator_from_arguments(loaded.workload, loaded.net, body["evaluator"])
            except ValueError as e:
                raise RequestRefused(str(e)) from None
            self._evaluators = {key: evaluator}  # one evaluator at a time: each holds a validation subset
        evaluator = self._evaluators[key]
        settings = {**evaluator.settings, "checkpoint": loaded.digest}
        configs = len(body["share"].get("configs", []))
        try:  # BN recalibration draws from generators of its own: no lock against other threads
            answer = answer_share(evaluator, body["share"], loaded.net.space, settings)
        except ValueError as e:  # other settings, configs outside the space: not ours to compute
            raise RequestRefused(str(e)) from None
        self.counters["served"] += 1
        self.counters["configs"] += configs
        logger.info(f"evaluated {configs} sub-network(s) for the aggregator's search")
        return answer

    def _checkpoint(self, named: dict, requester: str):

        sha = named["sha256"]
        if sha in self._loaded:
            return self._loaded[sha]
        path = self.cache / f"{sha}.pt"
        if not path.exists() or path.stat().st_size != named["size"] or file_sha256(path)[0] != sha:
            fetch_checkpoint(self.endpoint, requester, self.task_id, sha, named["size"], path)
            self._prune(keep=path)
        try:
            loaded = load_checkpoint(path, task=self.validation_task() if self.validation_task else None)
        except CheckpointError as e:
            raise RequestRefused(f"unusable checkpoint: {e}") from None
        if loaded.digest != named["digest"]:
            raise RequestRefused("the checkpoint's state digest is not the one the request names")
        task = loaded.workload.cfg.task
        self._loaded = {sha: loaded}
        logger.info(f"search checkpoint {sha[:12]} ready ({task}, round {loaded.round})")
        return loaded

    def _prune(self, keep: Path) -> None:
        old = sorted(self.cache.glob("*.pt"), key=lambda p: p.stat().st_mtime, reverse=True)
        for path in [p for p in old if p != keep][KEEP_CHECKPOINTS - 1 :]:
            path.unlink(missing_ok=True)

    def shutdown(self) -> None:
        self.endpoint.unserve(evaluate_handler(self.task_id))
        self._executor.shutdown(wait=True, cancel_futures=True)
