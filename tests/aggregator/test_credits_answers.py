"""The desk's ``credits`` answers: kept up to date with a real ledger file as it grows (the same rows
and table as reading the whole ledger), and a budget of calls per caller and for all callers."""

from __future__ import annotations

from aggregator.call_budget import CallBudget
from aggregator.receipt_answers import CreditsBook
from ledger.rewards import compute_rewards
from ledger.store import LedgerStore
from protocol.records import ContributionReceipt, Revocation
from protocol.sealing import parse_sealed
from tests.ledger.helpers import AGGREGATOR, ORIGIN, PEERS
from tests.protocol.factories import sealed_receipt


def _whole_ledger_rows(store: LedgerStore, key: str) -> list[tuple[int, int, bool]]:
    """(index, credit, revoked) of ``key``'s receipts, reading every entry (what a call did before)."""
    receipts, revoked = {}, set()
    for index, data in store.entries():
        sealed = parse_sealed(data, (ContributionReceipt, Revocation))
        if isinstance(sealed.record, Revocation):
            revoked.add(sealed.record.entry_index)
        elif sealed.public_key.hex() == key:
            receipts[index] = sealed.record.credit
    return [(index, credit, index in revoked) for index, credit in receipts.items()]


def test_the_book_answers_as_the_whole_ledger_does_while_it_grows(tmp_path):
    book = CreditsBook(AGGREGATOR.public_key)
    key = PEERS[1].public_key_hex
    with LedgerStore.open(
        tmp_path / "l.db", create=True, origin=ORIGIN, log_public_key=AGGREGATOR.public_key
    ) as store:
        for round_ in range(4):
            batch = [
                sealed_receipt(p, round_ + 1, round=round_, samples=10 * (k + 1)) for k, p in enumerate(PEERS)
            ]
            store.append_batch(batch, AGGREGATOR)
            if round_ == 2:
                store.revoke(len(PEERS) + 1, "failed audit", AGGREGATOR, task_id="t")  # peer 1, round 1
            rows, rewards = book.entries_of(store, key)
            assert [(r["index"], r["credit"], r["revoked"]) for r in rows] == _whole_ledger_rows(store, key)
            assert rewards == compute_rewards((d for _, d in store.entries()), AGGREGATOR.public_key)
            head = store.latest_checkpoint()
            assert all(r["checkpoint"] == head.note and len(r["proof"]) > 0 for r in rows)
    assert [r["revoked"] for r in rows] == [False, True, False, False]


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_caller_gets_its_budget_then_waits_for_it_to_refill():
    clock = Clock()
    budget = CallBudget(per_caller=3, overall=100, period=60.0, clock=clock)
    assert [budget.allow("QmA") for _ in range(4)] == [True, True, True, False]
    assert budget.allow("QmB")  # another caller has its own
    clock.now = 20.0  # a third of the period: one call back
    assert budget.allow("QmA") and not budget.allow("QmA")


def test_many_callers_together_get_the_overall_budget_only():
    clock = Clock()
    budget = CallBudget(per_caller=3, overall=10, period=60.0, clock=clock)
    answered = sum(budget.allow(f"QmThrowAway{i}") for i in range(50))  # fresh peer ids cost nothing
    assert answered == 10
    clock.now = 60.0
    assert budget.allow("QmHonest")
