"""What the contribution desk tells a peer about its receipts, read from the ledger: an entry's
inclusion proof against the latest checkpoint, and a key's entries with their proofs, revocations and
credit. The ledger reads are the caller's to run as ledger-writer jobs."""

from __future__ import annotations

from ledger.rewards import Rewards, compute_rewards
from ledger.store import LedgerStore
from protocol.merkle import leaf_hash
from protocol.records import ContributionReceipt, Revocation
from protocol.sealing import parse_sealed


def inclusion(store: LedgerStore, index: int) -> dict:
    """``index``, its RFC 9162 inclusion ``proof`` (hex) in the tree of the latest checkpoint, and
    that ``checkpoint``'s note. ``index`` must lie within that checkpoint."""
    head = store.latest_checkpoint()
    proof = store.inclusion_proof(index, head.size)
    return {"index": index, "proof": [h.hex() for h in proof], "checkpoint": head.note}


def entries_of(store: LedgerStore, key: str, log_public_key: bytes) -> tuple[list[dict], Rewards]:
    """Every receipt of the hex public key ``key`` in log order (round, seq, samples, credit, whether
    it was revoked, its leaf hash and :func:`inclusion` proof), and the whole ledger's rewards."""
    entries, revoked = [], set()
    for index, data in store.entries():
        sealed = parse_sealed(data, (ContributionReceipt, Revocation))
        if isinstance(sealed.record, Revocation):
            revoked.add(sealed.record.entry_index)
        elif sealed.public_key.hex() == key:
            entries.append((index, sealed.record, leaf_hash(data)))
    rows = [
        {
            "index": index,
            "round": r.round,
            "seq": r.seq,
            "samples": r.samples,
            "credit": r.credit,
            "revoked": index in revoked,
            "leaf_hash": leaf.hex(),
            **inclusion(store, index),
        }
        for index, r, leaf in entries
    ]
    return rows, compute_rewards((d for _, d in store.entries()), log_public_key)


def credits_reply(key: str, rows: list[dict], rewards: Rewards) -> dict:
    """The answer to ``manta/<task>/credits``: ``key``'s entries (:func:`entries_of`), its credits
    and share (0 for a key with none), and the ledger's total credits."""
    mine = next((p for p in rewards.peers if p.public_key == key), None)
    return {
        "entries": rows,
        "credits": mine.credits if mine else 0,
        "share": mine.share if mine else 0.0,
        "total_credits": rewards.total_credits,
    }
