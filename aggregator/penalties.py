"""What a failed audit and a posted conviction do to the ledger.

Each penalty is one batch of revocations under one checkpoint, appended as a ledger-writer job and
published after (never on the writer). A failed audit or a conviction excludes the key and revokes
every receipt of it since its last passed audit. (An audit without a start state is no penalty: the
key owes an audit, :meth:`aggregator.trust.TrustBook.owe`.) Revocation reasons start with :data:`aggregator.trust.EXCLUDING_REASONS` where the key is
excluded, so :func:`excluded_keys` can rebuild the exclusions from the ledger.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable

from aggregator.ledger_writer import LedgerWriter
from aggregator.receipt_status import ReceiptStatus
from aggregator.trust import CONVICTION_REASON, EXCLUDING_REASONS, EXCLUSION_REASON, TrustBook
from ledger.store import LedgerStore, StoredCheckpoint
from protocol.identity import Identity
from protocol.records import ContributionReceipt, ReducerConviction, Revocation
from protocol.sealing import Sealed, parse_sealed

logger = logging.getLogger(__name__)


def excluded_keys(store: LedgerStore) -> list[str]:
    """Keys whose receipts an excluding revocation names, in log order (a key may repeat)."""
    keys: dict[int, str] = {}
    found = []
    for index, data in store.entries():
        sealed = parse_sealed(data, (ContributionReceipt, Revocation))
        if isinstance(sealed.record, ContributionReceipt):
            keys[index] = sealed.record.public_key
        elif sealed.record.reason.startswith(EXCLUDING_REASONS) and sealed.record.entry_index in keys:
            found.append(keys[sealed.record.entry_index])
    return found


def receipts_since(store: LedgerStore, key: str, after: int) -> list[bytes]:
    """Leaf hashes of the receipts of ``key`` past ledger index ``after`` that are not revoked yet."""
    owned, revoked = [], set()
    for index, data in store.entries(max(0, after + 1)):
        sealed = parse_sealed(data, (ContributionReceipt, Revocation))
        if isinstance(sealed.record, Revocation):
            revoked.add(sealed.record.entry_index)
        elif sealed.record.public_key == key:
            owned.append(index)
    return [store.leaf_hash(i) for i in owned if i not in revoked]


class Penalties:
    """Revokes and excludes for the contribution desk. ``receipts`` and ``counters`` are the desk's
    (owned by the ledger writer); ``publish`` publishes a checkpoint note."""

    def __init__(
        self,
        ledger: LedgerWriter[LedgerStore],
        identity: Identity,
        task_id: str,
        trust: TrustBook,
        receipts: ReceiptStatus,
        counters: Counter[str],
        publish: Callable[[str], None],
        on_excluded: Callable[[str, str], None] = lambda key, reason: None,
    ):
        """``on_excluded(key, reason)``: told after each key it excludes (the desk withdraws its
        membership)."""
        self.ledger, self.identity, self.task_id, self.trust = ledger, identity, task_id, trust
        self.receipts, self.counters, self.publish = receipts, counters, publish
        self.on_excluded = on_excluded

    def audit_failed(
        self, sealed: Sealed[ContributionReceipt], distance: float, *, after: int | None = None
    ) -> None:
        """Exclude the key of a receipt whose recomputed gradient differs by ``distance``, and revoke
        every credit since its last passed audit. ``after``: that audit's ledger index where the trust
        book has excluded the key already (a second marginal audit)."""
        receipt = sealed.record
        how = "differs"
        if after is None:
            after = self.trust.failed(receipt.public_key)
        else:
            how = "differs a second time since the key's last passed audit"
        reason = (
            f"{EXCLUSION_REASON}: round {receipt.round}: recomputed gradient {how} (distance {distance:.3g}); "
            "every credit since the key's last passed audit revoked and the key excluded"
        )
        revoked, checkpoint = self.ledger.run(lambda _: self.revoke_since(receipt.public_key, after, reason))
        self.publish(checkpoint.note)
        self.on_excluded(receipt.public_key, f"failed an audit in round {receipt.round}")
        logger.warning(
            f"audit FAILED: {receipt.peer_id[-8:]} round {receipt.round}: key {receipt.public_key[:16]} "
            f"excluded, {len(revoked)} entr{'y' if len(revoked) == 1 else 'ies'} revoked"
        )

    def exclude_convicted(self, convictions: list[ReducerConviction]) -> None:
        """Treat a key that peers convicted of telling members different stories as a reducer
        (:class:`protocol.records.ReducerConviction`) as one that failed an audit; a key convicted
        before is skipped."""
        for conviction in convictions:
            key = conviction.reducer_key
            after = self.trust.convict(key)
            if after is None:
                continue
            reason = (
                f"{CONVICTION_REASON}: reducer {conviction.reducer} signed two different proofs for one "
                "all-reduce; every credit since the key's last passed audit revoked and the key excluded"
            )
            revoked, checkpoint = self.ledger.run(
                lambda _, key=key, after=after, reason=reason: self.revoke_since(key, after, reason)
            )
            if revoked:
                self.publish(checkpoint.note)
            self.counters["convicted"] += 1
            self.on_excluded(key, "convicted of telling members of one all-reduce different stories")
            logger.warning(
                f"CONVICTED: {conviction.reducer[-8:]} key {key[:16]} sent different signed proofs "
                f"(posted by {conviction.public_key[:16]}): excluded, {len(revoked)} entr"
                f"{'y' if len(revoked) == 1 else 'ies'} revoked"
            )

    def revoke_since(self, key: str, after: int, reason: str) -> tuple[list[int], StoredCheckpoint]:
        """Revoke every receipt of ``key`` past ledger index ``after`` not revoked yet (a writer job)."""
        return self.revoke(receipts_since(self.ledger.store, key, after), reason)

    def revoke(self, leaves: list[bytes], reason: str) -> tuple[list[int], StoredCheckpoint]:
        """Revoke the entries of ``leaves`` in one batch (a writer job): their indices and the
        checkpoint. Their status then answers accepted and revoked."""
        store = self.ledger.store
        indices = [store.index_of(leaf) for leaf in leaves]
        checkpoint = store.revoke_many(indices, reason, self.identity, task_id=self.task_id)
        for leaf, index in zip(leaves, indices):
            self.receipts.revoked(leaf, index)
        return indices, checkpoint
