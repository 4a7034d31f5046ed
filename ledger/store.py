"""The contribution ledger: an append-only RFC 9162 Merkle log in one SQLite file
(:mod:`ledger.sqlite_file` for the file, :mod:`ledger.stored_tree` for the stored tree).

Contract:

* ``LedgerStore.open(path, create=False, *, origin=None, log_public_key=None, readonly=False)``.
  Creating needs the log's ``origin`` (the checkpoints' first line and key name, e.g.
  ``manta.example/cifar10-ofa``) and the aggregator's Ed25519 public key, which every checkpoint must
  be signed with. A missing, truncated, corrupted or foreign file raises :class:`LedgerError`.
* ``append_batch(sealed_entries, signer)`` appends a round's entries and a signed checkpoint in one
  transaction and returns the checkpoint. The transaction commits with ``synchronous=FULL`` in WAL
  mode, so when it returns the entries are on disk; if anything fails, nothing of the batch is written.
* Entries are :class:`protocol.records.Sealed` ledger records (``ContributionReceipt``,
  ``Revocation``); the stored bytes are their exact wire bytes. A receipt's sequence number must be
  above its key's last one (kept durably in ``key_seq``); a revocation must be sealed by the log key
  and name an earlier receipt by index and leaf hash. Corrections are new entries: no stored row is
  ever updated or deleted.
* Reads: ``size``, ``root()``, ``entry(i)``, ``entries()``, ``leaf_hash(i)``, ``inclusion_proof(i,
  size=None)``, ``consistency_proof(old, new=None)``, ``root_at(size)``, ``checkpoints()``,
  ``latest_checkpoint()``, ``last_seq(public_key)``, ``index_of(leaf_hash)``.
* Appending hashes O(1) per entry: the in-memory :class:`~protocol.merkle.MerkleFrontier` is
  restored from O(log n) rows on first use.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Iterator, Sequence
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ledger.errors import LedgerError
from ledger.sqlite_file import check_sqlite_file, connect_readonly, create_schema, read_meta
from ledger.stored_tree import load_frontier, stored_node, subtree_hasher
from protocol.identity import Identity, fingerprint
from protocol.ledger_checkpoint import Checkpoint
from protocol.merkle import EMPTY_ROOT, MerkleFrontier, consistency_path, inclusion_path, leaf_hash
from protocol.note import NoteError, vkey
from protocol.records import ContributionReceipt, Revocation
from protocol.sealing import Sealed, make_sealed


@dataclass(frozen=True)
class StoredCheckpoint:
    """A checkpoint as the ledger keeps it: its sequence number, the parsed head and the note text."""

    seq: int
    checkpoint: Checkpoint
    note: str
    created_ms: int

    @property
    def size(self) -> int:
        return self.checkpoint.size


class LedgerStore:
    """An open ledger file. One writer process at a time (SQLite enforces it). The connection may be
    used from several threads, but not concurrently: callers serialise access (the aggregator runs
    every use on its ledger writer, :mod:`aggregator.ledger_writer`)."""

    def __init__(
        self, conn: sqlite3.Connection, path: Path, origin: str, log_public_key: bytes, readonly: bool
    ):
        self._conn = conn
        self.path = path
        self.origin = origin
        self.log_public_key = log_public_key
        self.readonly = readonly
        self._loaded_frontier: MerkleFrontier | None = None  # restored on first use (verify never needs it)

    # -- opening ------------------------------------------------------------------------------
    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        create: bool = False,
        *,
        origin: str | None = None,
        log_public_key: bytes | None = None,
        readonly: bool = False,
    ) -> LedgerStore:
        """Open the ledger at ``path`` (creating it when ``create`` and missing); LedgerError if unusable.

        When ``origin`` / ``log_public_key`` are given for an existing ledger they must match it.
        """
        file = Path(path).expanduser()
        exists = file.exists()
        if not exists and not create:
            raise LedgerError(f"no ledger at {file}")
        if exists:
            check_sqlite_file(file)
        elif origin is None or log_public_key is None:
            raise LedgerError("creating a ledger needs its origin and the aggregator's public key")
        try:
            conn = (
                connect_readonly(file)
                if exists and readonly
                else sqlite3.connect(file, isolation_level=None, check_same_thread=False)
            )
        except sqlite3.Error as exc:
            raise LedgerError(f"cannot open ledger {file}: {exc}") from None
        try:
            conn.execute("PRAGMA synchronous=FULL")
            if not exists:
                create_schema(conn, origin or "", log_public_key or b"")
            meta = read_meta(conn, file)
            if origin is not None and meta["origin"] != origin:
                raise LedgerError(f"{file} is the ledger of {meta['origin']}, not of {origin}")
            key = bytes.fromhex(meta["log_public_key"])
            if log_public_key is not None and key != log_public_key:
                raise LedgerError(
                    f"{file} is signed by key {fingerprint(key)}, not {fingerprint(log_public_key)}"
                )
            return cls(conn, file, meta["origin"], key, readonly)
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise LedgerError(f"{file} is corrupted or not a MANTA ledger ({exc})") from None
        except BaseException:
            conn.close()
            raise

    @property
    def _frontier(self) -> MerkleFrontier:
        if self._loaded_frontier is None:
            try:
                self._loaded_frontier = load_frontier(self._conn, self.path)
            except sqlite3.DatabaseError as exc:
                raise LedgerError(f"{self.path} is corrupted ({exc})") from None
        return self._loaded_frontier

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> LedgerStore:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- state --------------------------------------------------------------------------------
    @property
    def size(self) -> int:
        return self._frontier.size

    def root(self) -> bytes:
        return self._frontier.root()

    @property
    def vkey(self) -> str:
        """The C2SP verifier key of this log (key name = origin)."""
        return vkey(self.origin, self.log_public_key)

    def last_seq(self, public_key: bytes) -> int | None:
        row = self._conn.execute(
            "SELECT last_seq FROM key_seq WHERE public_key = ?", (public_key,)
        ).fetchone()
        return None if row is None else row[0]

    def index_of(self, leaf: bytes) -> int | None:
        """Index of the entry with this leaf hash, if it is in the log."""
        row = self._conn.execute("SELECT idx FROM entries WHERE leaf_hash = ?", (leaf,)).fetchone()
        return None if row is None else row[0]

    # -- appending ----------------------------------------------------------------------------
    def append_batch(
        self, entries: Sequence[Sealed[Any]], signer: Identity, *, now_ms: int | None = None
    ) -> StoredCheckpoint:
        """Append ``entries`` in order and a checkpoint signed by ``signer``, in one transaction.

        ``entries`` may be empty (a checkpoint re-signed at the same size). Raises LedgerError, with
        nothing written, if an entry is refused or the transaction fails.
        """
        if self.readonly:
            raise LedgerError(f"{self.path} was opened read-only")
        if signer.public_key != self.log_public_key:
            raise LedgerError(f"checkpoints of this ledger are signed by {fingerprint(self.log_public_key)}")
        conn = self._conn
        created_ms = int(time.time() * 1000) if now_ms is None else now_ms
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise LedgerError(f"cannot write to ledger {self.path}: {exc}") from None
        try:
            (top,) = conn.execute("SELECT max(idx) FROM entries").fetchone()
            if (0 if top is None else top + 1) != self.size:
                raise LedgerError(f"{self.path} was appended to by another writer; reopen it")
            frontier = self._frontier.copy()
            rows, node_rows, seqs = [], [], {}
            for sealed in entries:
                index = frontier.size
                leaf = leaf_hash(sealed.wire)
                self._check_entry(sealed, index, seqs)
                rows.append((index, sealed.wire, leaf))
                node_rows.extend(frontier.append(leaf))
            conn.executemany("INSERT INTO entries(idx, data, leaf_hash) VALUES (?, ?, ?)", rows)
            conn.executemany("INSERT INTO nodes(level, idx, hash) VALUES (?, ?, ?)", node_rows)
            conn.executemany(
                "INSERT INTO key_seq(public_key, last_seq, last_idx) VALUES (?, ?, ?) ON CONFLICT(public_key)"
                " DO UPDATE SET last_seq = excluded.last_seq, last_idx = excluded.last_idx",
                [(key, seq, idx) for key, (seq, idx) in seqs.items()],
            )
            head = Checkpoint(origin=self.origin, size=frontier.size, root=frontier.root().hex())
            note = head.to_note(signer)
            cur = conn.execute(
                "INSERT INTO checkpoints(size, created_ms, note) VALUES (?, ?, ?)",
                (head.size, created_ms, note),
            )
            conn.execute("COMMIT")
        except BaseException as exc:
            with suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            if isinstance(exc, sqlite3.IntegrityError):
                raise LedgerError(f"append refused: an entry is already in the ledger ({exc})") from None
            if isinstance(exc, sqlite3.Error):
                raise LedgerError(f"append to {self.path} failed, nothing was written: {exc}") from None
            raise
        self._loaded_frontier = frontier
        return StoredCheckpoint(cur.lastrowid, head, note, created_ms)

    def _check_entry(self, sealed: Sealed[Any], index: int, seqs: dict[bytes, tuple[int, int]]) -> None:
        record = sealed.record
        if isinstance(record, ContributionReceipt):
            last = seqs.get(sealed.public_key)
            last_seq = last[0] if last is not None else self.last_seq(sealed.public_key)
            if last_seq is not None and record.seq <= last_seq:
                raise LedgerError(
                    f"entry {index}: sequence number {record.seq} of key {fingerprint(sealed.public_key)} "
                    f"is not above its last one, {last_seq}"
                )
            seqs[sealed.public_key] = (record.seq, index)
        elif isinstance(record, Revocation):
            if sealed.public_key != self.log_public_key:
                raise LedgerError(f"entry {index}: a revocation must be sealed by the log's key")
            target = record.entry_index
            if target >= self.size:
                raise LedgerError(
                    f"entry {index}: a revocation names an entry of an earlier batch, not {target}"
                )
            if self.leaf_hash(target).hex() != record.entry_leaf_hash:
                raise LedgerError(f"entry {index}: entry {target} does not have the revoked leaf hash")
            if not self.entry(target).startswith(ContributionReceipt.prefix()):
                raise LedgerError(f"entry {index}: only receipts can be revoked, entry {target} is not one")
        else:
            raise LedgerError(f"entry {index}: a {type(record).__name__} is not a ledger entry")

    def revoke(
        self, index: int, reason: str, signer: Identity, *, task_id: str, now_ms: int | None = None
    ) -> StoredCheckpoint:
        """Append a revocation of receipt ``index`` (its credit is cancelled) as its own batch."""
        ts = int(time.time() * 1000) if now_ms is None else now_ms
        record = Revocation(
            task_id=task_id,
            entry_index=index,
            entry_leaf_hash=self.leaf_hash(index).hex(),
            reason=reason,
            timestamp=ts,
        )
        return self.append_batch([make_sealed(record, signer)], signer, now_ms=now_ms)

    def revoke_many(
        self,
        indices: Sequence[int],
        reason: str,
        signer: Identity,
        *,
        task_id: str,
        now_ms: int | None = None,
    ) -> StoredCheckpoint:
        """Append a revocation of each receipt of ``indices`` in one batch, under one checkpoint (a
        key excluded after a failed audit loses every credit since its last passed one at once)."""
        ts = int(time.time() * 1000) if now_ms is None else now_ms
        records = [
            Revocation(
                task_id=task_id,
                entry_index=index,
                entry_leaf_hash=self.leaf_hash(index).hex(),
                reason=reason,
                timestamp=ts,
            )
            for index in indices
        ]
        return self.append_batch([make_sealed(r, signer) for r in records], signer, now_ms=now_ms)

    # -- reading ------------------------------------------------------------------------------
    def _check_index(self, index: int, size: int | None = None) -> None:
        limit = self.size if size is None else size
        if not isinstance(index, int) or not 0 <= index < limit:
            raise LedgerError(f"no entry {index}: the ledger has {limit} entries")

    def entry(self, index: int) -> bytes:
        self._check_index(index)
        row = self._conn.execute("SELECT data FROM entries WHERE idx = ?", (index,)).fetchone()
        if row is None:
            raise LedgerError(f"{self.path} is corrupted (entry {index} is missing)")
        return row[0]

    def leaf_hash(self, index: int) -> bytes:
        self._check_index(index)
        found = stored_node(self._conn, 0, index)
        if found is None:
            raise LedgerError(f"{self.path} is corrupted (entry {index} is missing)")
        return found

    def entries(self, start: int = 0, stop: int | None = None) -> Iterator[tuple[int, bytes]]:
        """``(index, bytes)`` of entries ``[start, stop)`` in log order."""
        stop = self.size if stop is None else min(stop, self.size)
        cur = self._conn.execute(
            "SELECT idx, data FROM entries WHERE idx >= ? AND idx < ? ORDER BY idx", (start, stop)
        )
        yield from cur

    def root_at(self, size: int) -> bytes:
        """Root of the tree of the first ``size`` entries."""
        if not 0 <= size <= self.size:
            raise LedgerError(f"no tree of size {size}: the ledger has {self.size} entries")
        return subtree_hasher(self._conn, self.path)(0, size) if size else EMPTY_ROOT

    def inclusion_proof(self, index: int, size: int | None = None) -> list[bytes]:
        """RFC 9162 inclusion proof of entry ``index`` in the tree of ``size`` (default: all) entries."""
        size = self.size if size is None else size
        if not 0 < size <= self.size:
            raise LedgerError(f"no tree of size {size}: the ledger has {self.size} entries")
        self._check_index(index, size)
        return inclusion_path(index, size, subtree_hasher(self._conn, self.path))

    def consistency_proof(self, old_size: int, new_size: int | None = None) -> list[bytes]:
        """RFC 9162 consistency proof between the trees of ``old_size`` and ``new_size`` entries."""
        new_size = self.size if new_size is None else new_size
        if not 0 < old_size <= new_size <= self.size:
            raise LedgerError(
                f"no consistency proof from size {old_size} to {new_size} (ledger size {self.size})"
            )
        return consistency_path(old_size, new_size, subtree_hasher(self._conn, self.path))

    def checkpoints(self) -> Iterator[StoredCheckpoint]:
        """Every checkpoint, oldest first, parsed after checking its signature by the log key."""
        for seq, note, created_ms in self._conn.execute(
            "SELECT seq, note, created_ms FROM checkpoints ORDER BY seq"
        ):
            yield self._parse_checkpoint(seq, note, created_ms)

    def latest_checkpoint(self) -> StoredCheckpoint | None:
        row = self._conn.execute(
            "SELECT seq, note, created_ms FROM checkpoints ORDER BY seq DESC LIMIT 1"
        ).fetchone()
        return None if row is None else self._parse_checkpoint(*row)

    def _parse_checkpoint(
        self, seq: int, note: str, created_ms: int, public_key: bytes | None = None
    ) -> StoredCheckpoint:
        try:
            head = Checkpoint.from_note(note, public_key or self.log_public_key, self.origin)
        except (NoteError, ValueError) as exc:
            raise LedgerError(f"checkpoint {seq}: {exc}") from None
        return StoredCheckpoint(seq, head, note, created_ms)
