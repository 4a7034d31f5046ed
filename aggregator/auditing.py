"""Spot audits of accepted receipts, on a thread of their own.

A fraction of accepted receipts, chosen by an HMAC of the receipt under a secret only this aggregator
can derive (unpredictable to peers, reproducible for the operator), is replayed from the round's
start state (:mod:`aggregator.audits`). Start states are fetched by digest from the peers that held
them (:mod:`aggregator.checkpoints`). An audit whose start state cannot be had is tried again
:data:`RETRY_AFTER` seconds later, and once more on stop, before it is reported unavailable. What to
do with a verdict (count it, revoke the entry) is the desk's: :class:`SpotAuditor` reports each one
to its ``on_verdict`` callback.
"""

from __future__ import annotations

import hashlib
import heapq
import hmac
import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable

from aggregator.audits import AuditResult, Verdict, audit_receipt
from protocol.records import ContributionReceipt
from protocol.sealing import Sealed

logger = logging.getLogger(__name__)

OnVerdict = Callable[[Sealed[ContributionReceipt], AuditResult], None]
RETRY_AFTER = (20.0, 60.0, 180.0)  # seconds before each new try of an audit without its start state


class SpotAuditor:
    def __init__(self, workload, states, task_seed: int, secret: bytes, on_verdict: OnVerdict):
        self.workload, self.states, self.task_seed = workload, states, task_seed
        self.on_verdict = on_verdict
        self._secret = secret
        self._queue: queue.Queue[tuple[Sealed[ContributionReceipt], int]] = queue.Queue()  # (receipt, try)
        self._retries: list[tuple[float, int, Sealed[ContributionReceipt], int]] = []  # audit thread's
        self._order = itertools.count()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="manta-audits", daemon=True)
        self._thread.start()

    def selected(self, wire: bytes, fraction: float) -> bool:
        """Whether to audit ``wire`` at the rate ``fraction`` (its key's: :mod:`aggregator.trust`)."""
        if fraction <= 0 or self.workload is None or self.states is None:
            return False
        mac = hmac.new(self._secret, wire, hashlib.sha256).digest()
        return int.from_bytes(mac[:8], "big") / 2**64 < fraction

    def enqueue(self, sealed: Sealed[ContributionReceipt]) -> None:
        """Audit ``sealed`` on the audit thread; its start state is kept from when it is fetched
        (by the prefetch, or the audit itself) until the audit is done."""
        if self.states is not None:
            self.states.hold(sealed.record.state_digest)
        self._queue.put((sealed, 0))

    def _loop(self) -> None:
        # On stop, the audits already chosen still run, retries at once (stop waits a bounded time).
        while not (self._stop.is_set() and self._queue.empty() and not self._retries):
            stopping = self._stop.is_set()
            if self._retries and (stopping or self._retries[0][0] <= time.monotonic()):
                _, _, sealed, tries = heapq.heappop(self._retries)
                self._run(sealed, tries, last=stopping or tries >= len(RETRY_AFTER))
                continue
            wait = 1.0 if not self._retries else min(1.0, max(0.0, self._retries[0][0] - time.monotonic()))
            try:
                sealed, tries = self._queue.get(timeout=wait)
            except queue.Empty:
                continue
            self._run(sealed, tries, last=False)

    def _run(self, sealed: Sealed[ContributionReceipt], tries: int, last: bool) -> None:
        try:
            if self.audit(sealed, final=last).verdict is Verdict.UNAVAILABLE and not last:
                due = time.monotonic() + RETRY_AFTER[tries]
                heapq.heappush(self._retries, (due, next(self._order), sealed, tries + 1))
                return
        except Exception as e:  # the aggregator's own fault (the receipt's are verdicts): say so
            logger.error(f"audit of a receipt of round {sealed.record.round} failed to run: {e!r}")
        if self.states is not None:
            self.states.release(sealed.record.state_digest)

    def audit(self, sealed: Sealed[ContributionReceipt], final: bool = True) -> AuditResult:
        """Replay one receipt and report the result; an unavailable start state is reported only if
        ``final`` (the auditor tries again otherwise)."""
        receipt = sealed.record
        state = self.states.start_state(receipt.state_digest, timeout=30.0)
        if state is None:
            logger.info(f"audit put off: no copy of the start state of round {receipt.round}")
            result = AuditResult(Verdict.UNAVAILABLE, float("nan"))
            if final:
                self.on_verdict(sealed, result)
            return result
        result = audit_receipt(self.workload, state, receipt, self.task_seed)
        if result.verdict is Verdict.PASSED:
            logger.info(
                f"audit passed: {receipt.peer_id[-8:]} round {receipt.round} (distance {result.distance:.1e})"
            )
        self.on_verdict(sealed, result)
        return result

    def stop(self, timeout: float = 120.0) -> None:
        self._stop.set()
        self._thread.join(timeout=timeout)
