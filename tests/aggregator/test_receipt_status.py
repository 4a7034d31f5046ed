"""The desk's receipt statuses stay bounded: accepted receipts are answered from the ledger, only the
newest refusals are remembered, and a transient refusal is not remembered at all."""

from __future__ import annotations

from collections import Counter

from aggregator import receipt_status
from aggregator.receipt_status import ReceiptStatus
from ledger.store import LedgerStore
from protocol.sealing import RejectReason
from tests.ledger.helpers import AGGREGATOR, ORIGIN


def test_refusals_are_bounded_and_a_transient_one_is_not_remembered(tmp_path, monkeypatch):
    monkeypatch.setattr(receipt_status, "MAX_REFUSALS", 3)
    with LedgerStore.open(
        tmp_path / "l.db", create=True, origin=ORIGIN, log_public_key=AGGREGATOR.public_key
    ) as store:
        status = ReceiptStatus(store, Counter())
        leaves = [bytes([i]) * 32 for i in range(5)]
        for leaf in leaves:
            status.queued(leaf, 7)
            status.reject(leaf, RejectReason.WRONG_TASK, "for another task")
        assert status.settled(leaves[0]) is None and status.answer(leaves[0]) == {"status": "unknown"}
        assert [status.settled(leaf)["reason"] for leaf in leaves[2:]] == ["wrong_task"] * 3
        unbound = bytes([9]) * 32
        answer = status.reject(unbound, RejectReason.UNBOUND_PEER, "no binding from its sender")
        assert answer["retry"] is True and status.settled(unbound) is None  # screened again next time
        assert status.counters == Counter({"wrong_task": 5, "unbound_peer": 1})
        assert len(status._refused) == 3 and not status._status  # nothing else is kept
