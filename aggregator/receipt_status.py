"""What the contribution desk says about each receipt it has seen, by leaf hash: queued (with its
round), accepted (with its ledger index, and ``revoked`` once it was), or rejected with a reason and
detail; with the desk's counts of accepted receipts and of each rejection reason.

Memory stays bounded: an accepted receipt's answer comes from the ledger itself, and only the newest
:data:`MAX_REFUSALS` refusals are remembered (a peer asking about an older one hears ``unknown``,
submits it again and has it screened again). A transient refusal (a receipt whose sender has not
handed over its binding yet) is answered with ``retry`` and not remembered at all."""

from __future__ import annotations

import logging
from collections import Counter, OrderedDict

from aggregator.receipt_answers import inclusion
from ledger.store import LedgerStore
from protocol.sealing import RejectReason

logger = logging.getLogger(__name__)

MAX_REFUSALS = 100_000  # refusals remembered, newest kept
TRANSIENT = frozenset({RejectReason.UNBOUND_PEER})  # a later submission of the same bytes may pass


class ReceiptStatus:
    """The status table of one ledger. It belongs to the ledger writer: every method is a writer job.
    ``counters`` is the desk's (accepted, each rejection reason, audits). The methods that answer
    return the stored status itself, not a copy."""

    def __init__(self, store: LedgerStore, counters: Counter[str]):
        self.store, self.counters = store, counters
        # leaf hash -> {"status": ..., ...}: queued receipts (until their round closes), revoked ones
        self._status: dict[bytes, dict] = {}
        self._refused: OrderedDict[bytes, dict] = OrderedDict()  # the newest MAX_REFUSALS, oldest first

    def settled(self, leaf: bytes) -> dict | None:
        """The answer for a receipt seen before (refused, or a replay of a ledger entry); else None.
        A replay is counted and refused each time, and never stored."""
        refused = self._refused.get(leaf)
        if refused is not None:
            return refused
        known = self._status.get(leaf)
        if known is not None and known["status"] != "accepted":
            return known
        if known is not None or self.store.index_of(leaf) is not None:
            # Exactly these bytes are already in the ledger: submitting them again is a replay.
            self.counters[RejectReason.REPLAY.value] += 1
            logger.info(f"receipt refused: replay of ledger entry {self.store.index_of(leaf)}")
            return {
                "status": "rejected",
                "reason": RejectReason.REPLAY.value,
                "detail": "already in the ledger",
            }
        return None

    def queued(self, leaf: bytes, round_: int) -> dict:
        """Note a receipt of round ``round_`` waiting for its round to close."""
        self._status[leaf] = {"status": "queued", "round": round_}
        return self._status[leaf]

    def reject(self, leaf: bytes, reason: RejectReason, detail: str) -> dict:
        """Refuse a receipt for ``reason`` (counted and logged); a :data:`TRANSIENT` reason is answered
        with ``retry`` and not remembered."""
        self.counters[reason.value] += 1
        logger.info(f"receipt refused: {reason.value}: {detail}")
        answer = {"status": "rejected", "reason": reason.value, "detail": detail}
        self._status.pop(leaf, None)
        if reason in TRANSIENT:
            return {**answer, "retry": True}
        self._refused[leaf] = answer
        self._refused.move_to_end(leaf)
        while len(self._refused) > MAX_REFUSALS:
            self._refused.popitem(last=False)
        return answer

    def accept(self, leaf: bytes) -> None:
        """Note a receipt appended to the ledger (counted; its answer comes from the ledger)."""
        self._status.pop(leaf, None)
        self.counters["accepted"] += 1

    def revoked(self, leaf: bytes, index: int) -> None:
        """Note that the receipt at ledger ``index`` was revoked."""
        self._status[leaf] = {"status": "accepted", "index": index, "revoked": True}

    def answer(self, leaf: bytes) -> dict:
        """The answer to ``manta/<task>/status``: ``unknown``, the stored status, or, for an accepted
        receipt, that status with its :func:`~aggregator.receipt_answers.inclusion` proof."""
        known = self._refused.get(leaf) or self._status.get(leaf)
        if known is None:
            index = self.store.index_of(leaf)
            if index is None:
                return {"status": "unknown"}
            known = {"status": "accepted", "index": index}
        if known["status"] != "accepted":
            return known
        return {**known, **inclusion(self.store, known["index"])}
