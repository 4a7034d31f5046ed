"""A ledger checked against a checkpoint pinned outside it: an auditor keeps a note the aggregator once
published, and a later copy of the ledger must extend that tree. Without it, a ledger whose last
batches and checkpoints were removed still verifies: every remaining root and signature holds."""

from __future__ import annotations

import os

from ledger.store import LedgerStore
from protocol.ledger_checkpoint import Checkpoint
from protocol.merkle import verify_consistency
from protocol.note import NoteError


def pinned_problem(
    path: str | os.PathLike[str], note: str, log_public_key: bytes | None = None
) -> str | None:
    """Why the ledger at ``path`` does not extend the checkpoint ``note`` (signed by ``log_public_key``,
    default: the key recorded in the file), or None if it does (:func:`extends`). Run after
    :func:`ledger.verify.verify_ledger`, which checks the file's own roots and signatures."""
    with LedgerStore.open(path, readonly=True) as store:
        key = log_public_key or store.log_public_key
        try:
            pinned = Checkpoint.from_note(note, key)
        except (NoteError, ValueError) as exc:
            return f"the pinned checkpoint is not a note signed by the log's key ({exc})"
        return extends(store, pinned)


def extends(store: LedgerStore, pinned: Checkpoint) -> str | None:
    """Why ``store`` does not extend the (signature-checked) checkpoint ``pinned``, or None: it holds
    at least its entries, its root at that size is the pinned one, and an RFC 9162 consistency proof
    leads from that tree to the ledger's latest checkpoint."""
    if pinned.origin != store.origin:
        return f"the pinned checkpoint is of log {pinned.origin!r}, not {store.origin!r}"
    if pinned.size > store.size:
        return (
            f"the ledger holds {store.size} entries, fewer than the {pinned.size} of the pinned "
            "checkpoint: entries were removed"
        )
    if pinned.size == 0:
        return None
    if store.root_at(pinned.size) != pinned.root_bytes:
        return f"the ledger's tree of {pinned.size} entries is not the pinned checkpoint's"
    head = store.latest_checkpoint()
    if head is None or head.checkpoint.size < pinned.size:
        return "the ledger has no checkpoint at or past the pinned one"
    proof = store.consistency_proof(pinned.size, head.checkpoint.size)
    if not verify_consistency(
        pinned.size, head.checkpoint.size, pinned.root_bytes, head.checkpoint.root_bytes, proof
    ):
        return f"no consistency proof from the pinned tree to the checkpoint of size {head.checkpoint.size}"
    return None
