"""Spot audits of accepted receipts, on a thread of their own.

A fraction of accepted receipts, chosen by an HMAC of the receipt under a secret only this aggregator
can derive (unpredictable to peers, reproducible for the operator), is replayed from the round's
start state (:mod:`aggregator.audits`). Start states are fetched by digest from the peers that held
them (:mod:`aggregator.checkpoints`). What to do with a verdict (count it, revoke the entry) is the
desk's: :class:`SpotAuditor` reports each one to its ``on_verdict`` callback.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import queue
import threading
from collections.abc import Callable

from aggregator.audits import audit_receipt
from protocol.records import ContributionReceipt
from protocol.sealing import Sealed

logger = logging.getLogger(__name__)

# (receipt, passed or None when its start state could not be had, relative sketch distance)
Verdict = Callable[[Sealed[ContributionReceipt], bool | None, float], None]


class SpotAuditor:
    def __init__(self, workload, states, task_seed: int, secret: bytes, on_verdict: Verdict):
        self.workload, self.states, self.task_seed = workload, states, task_seed
        self.on_verdict = on_verdict
        self._secret = secret
        self._queue: queue.Queue[Sealed[ContributionReceipt]] = queue.Queue()
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
        self._queue.put(sealed)

    def _loop(self) -> None:
        # On stop, the audits already chosen still run (stop waits a bounded time for them).
        while not (self._stop.is_set() and self._queue.empty()):
            try:
                sealed = self._queue.get(timeout=1.0)
            except queue.Empty:
                continue
            try:
                self.audit(sealed)
            except Exception as e:  # the aggregator's own fault (the receipt's are verdicts): say so
                logger.error(f"audit of a receipt of round {sealed.record.round} failed to run: {e!r}")

    def audit(self, sealed: Sealed[ContributionReceipt]) -> bool | None:
        """Replay one receipt and report the verdict; None if its start state could not be had."""
        receipt = sealed.record
        state = self.states.state_for(receipt.state_digest, timeout=30.0)
        if state is None:
            logger.info(f"audit skipped: no copy of the start state of round {receipt.round}")
            self.on_verdict(sealed, None, float("nan"))
            return None
        passed, distance = audit_receipt(self.workload, state, receipt, self.task_seed)
        if passed:
            logger.info(
                f"audit passed: {receipt.peer_id[-8:]} round {receipt.round} (distance {distance:.1e})"
            )
        self.on_verdict(sealed, passed, distance)
        return passed

    def stop(self, timeout: float = 120.0) -> None:
        self._stop.set()
        self._thread.join(timeout=timeout)
