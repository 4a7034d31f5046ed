"""What the contribution desk tells a peer about its receipts, read from the ledger: an entry's
inclusion proof against the latest checkpoint, and a key's entries with their proofs, revocations and
credit. The ledger reads are the caller's to run as ledger-writer jobs."""

from __future__ import annotations

from ledger.rewards import Rewards, RewardTally
from ledger.store import LedgerStore
from protocol.merkle import leaf_hash
from protocol.records import ContributionReceipt


def inclusion(store: LedgerStore, index: int) -> dict:
    """``index``, its RFC 9162 inclusion ``proof`` (hex) in the tree of the latest checkpoint, and
    that ``checkpoint``'s note. ``index`` must lie within that checkpoint."""
    head = store.latest_checkpoint()
    proof = store.inclusion_proof(index, head.size)
    return {"index": index, "proof": [h.hex() for h in proof], "checkpoint": head.note}


class CreditsBook:
    """Each key's receipts and the reward table, kept up to date with the ledger: a ``credits`` call
    reads only the entries appended since the one before (it re-read the whole ledger twice, seconds
    at 10^5 entries, on the ledger's single writer). Run its methods as ledger-writer jobs."""

    def __init__(self, log_public_key: bytes):
        self._tally = RewardTally(log_public_key)
        self._receipts: dict[str, list[tuple[int, ContributionReceipt, bytes]]] = {}  # hex key -> rows

    def catch_up(self, store: LedgerStore) -> None:
        """Count the entries appended to ``store`` since the last call."""
        for index, data in store.entries(self._tally.size):
            sealed = self._tally.add(data)
            if sealed is not None and isinstance(sealed.record, ContributionReceipt):
                rows = self._receipts.setdefault(sealed.public_key.hex(), [])
                rows.append((index, sealed.record, leaf_hash(data)))

    def entries_of(self, store: LedgerStore, key: str) -> tuple[list[dict], Rewards]:
        """Every receipt of the hex public key ``key`` in log order (round, seq, samples, credit,
        whether it was revoked, its leaf hash and :func:`inclusion` proof), and the rewards."""
        self.catch_up(store)
        rows = [
            {
                "index": index,
                "round": r.round,
                "seq": r.seq,
                "samples": r.samples,
                "credit": r.credit,
                "revoked": self._tally.revoked(index),
                "leaf_hash": leaf.hex(),
                **inclusion(store, index),
            }
            for index, r, leaf in self._receipts.get(key, [])
        ]
        return rows, self._tally.rewards()


def credits_reply(key: str, rows: list[dict], rewards: Rewards) -> dict:
    """The answer to ``manta/<task>/credits``: ``key``'s entries (:meth:`CreditsBook.entries_of`), its credits
    and share (0 for a key with none), and the ledger's total credits."""
    mine = next((p for p in rewards.peers if p.public_key == key), None)
    return {
        "entries": rows,
        "credits": mine.credits if mine else 0,
        "share": mine.share if mine else 0.0,
        "total_credits": rewards.total_credits,
    }
