"""The dashboard's read-only view of the contribution ledger (``<data-dir>/ledger.sqlite``).

The aggregator appends to the ledger in its own connection; this view opens the file read-only, never
writes, and tolerates its absence (a run before its first receipt shows an empty ledger). The head and
the reward table are refreshed by the collector's thread when the file changes, and recomputed only
when the ledger's size did; an inclusion proof is computed per request (O(log n) reads).
"""

from __future__ import annotations

import base64
import threading
from pathlib import Path
from typing import Any

from ledger.errors import LedgerError
from ledger.rewards import compute_rewards
from ledger.store import LedgerStore
from protocol.merkle import verify_inclusion
from protocol.records import LEDGER_ENTRY_TYPES
from protocol.sealing import parse_sealed

LEDGER_FILE = "ledger.sqlite"


class ProofNotFound(LookupError):
    """No such entry under the latest signed checkpoint (or no ledger / checkpoint yet)."""


def _file_state(path: Path) -> tuple[int, int, int, int] | None:
    """What changes when the ledger does: size and mtime of the file and of its write-ahead log."""
    try:
        main = path.stat()
    except OSError:
        return None
    try:
        wal = path.with_name(path.name + "-wal").stat()
        wal_state = (wal.st_size, wal.st_mtime_ns)
    except OSError:
        wal_state = (0, 0)
    return (main.st_size, main.st_mtime_ns, *wal_state)


class LedgerView:
    def __init__(self, path: Path):
        self.path = Path(path)
        self._lock = threading.Lock()
        self._state: tuple | None = None
        self._summary: dict[str, Any] = self._empty()
        self._rewards_size = -1

    def _empty(self, error: str | None = None) -> dict[str, Any]:
        return {"present": False, "path": str(self.path), "head": None, "rewards": None, "error": error}

    def refresh(self) -> None:
        """Re-read the head (and the rewards, if entries were added) when the file changed."""
        state = _file_state(self.path)
        if state is not None and state == self._state:
            return
        if state is None:
            summary = self._empty()
        else:
            try:
                summary = self._read()
            except (LedgerError, OSError, ValueError) as e:
                summary = self._empty(str(e).splitlines()[0] if str(e) else type(e).__name__)
        with self._lock:
            self._summary, self._state = summary, state

    def _read(self) -> dict[str, Any]:
        with LedgerStore.open(self.path, readonly=True) as store:
            latest = store.latest_checkpoint()
            head = {
                "origin": store.origin,
                "log_public_key": store.log_public_key.hex(),
                "vkey": store.vkey,
                "size": store.size,
                "root": store.root().hex(),
                "checkpoint": None
                if latest is None
                else {
                    "seq": latest.seq,
                    "size": latest.size,
                    "root": latest.checkpoint.root,
                    "created": latest.created_ms / 1000,
                    "note": latest.note,
                },
            }
            rewards = self._summary.get("rewards")
            if store.size != self._rewards_size or rewards is None:
                data = (wire for _, wire in store.entries())
                rewards = compute_rewards(data, store.log_public_key).to_json()
                self._rewards_size = store.size
        return {"present": True, "path": str(self.path), "head": head, "rewards": rewards, "error": None}

    def summary(self) -> dict[str, Any]:
        with self._lock:
            return self._summary

    def proof(self, index: int) -> dict[str, Any]:
        """Entry ``index`` with its RFC 9162 inclusion proof under the latest signed checkpoint.

        Raises :class:`ProofNotFound` if there is no ledger, no checkpoint or no such entry under it,
        and :class:`~ledger.errors.LedgerError` if the file is unusable.
        """
        if not self.path.exists():
            raise ProofNotFound("there is no ledger yet")
        with LedgerStore.open(self.path, readonly=True) as store:
            latest = store.latest_checkpoint()
            if latest is None:
                raise ProofNotFound("the ledger has no signed checkpoint yet")
            size = latest.size
            if not 0 <= index < size:
                raise ProofNotFound(f"no entry {index} under the latest checkpoint ({size} entries)")
            entry = store.entry(index)
            hashes = store.inclusion_proof(index, size)
            leaf = store.leaf_hash(index).hex()
        sealed = parse_sealed(entry, LEDGER_ENTRY_TYPES)
        return {
            "index": index,
            "leaf_hash": leaf,
            "entry": base64.b64encode(entry).decode(),
            "kind": sealed.record.RECORD_TYPE,
            "signer": sealed.public_key.hex(),
            "record": sealed.record.model_dump(mode="json"),
            "checkpoint": {
                "seq": latest.seq,
                "origin": latest.checkpoint.origin,
                "size": size,
                "root": latest.checkpoint.root,
                "note": latest.note,
            },
            "proof": [h.hex() for h in hashes],
            "verified": verify_inclusion(entry, index, size, hashes, latest.checkpoint.root_bytes),
        }
