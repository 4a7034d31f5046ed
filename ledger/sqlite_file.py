"""The ledger's SQLite file: its schema, the header checks that refuse a damaged or foreign file, and
the ``meta`` table that names the log.

Tables: ``meta(key, value)`` (``origin``, ``log_public_key``, ``created_ms``); ``entries(idx, data,
leaf_hash)`` with a unique index on ``leaf_hash``; ``nodes(level, idx, hash)``, the hash of every
complete perfect subtree above the leaves (level L, index i covers entries ``[i*2^L, (i+1)*2^L)``);
``checkpoints(seq, size, created_ms, note)``, each C2SP checkpoint note verbatim; ``key_seq(public_key,
last_seq, last_idx)``, the replay state. Triggers refuse every update and delete of ``entries``,
``nodes``, ``checkpoints`` and ``meta``.
"""

from __future__ import annotations

import os
import sqlite3
import struct
import time
from pathlib import Path

from ledger.errors import LedgerError
from protocol.ledger_checkpoint import Checkpoint
from protocol.merkle import EMPTY_ROOT

APPLICATION_ID = 0x4D4E5441  # "MNTA" in the SQLite header, so a foreign database is recognized at once
SCHEMA_VERSION = 1
_SQLITE_MAGIC = b"SQLite format 3\x00"

_SCHEMA = [
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID",
    "CREATE TABLE entries (idx INTEGER PRIMARY KEY, data BLOB NOT NULL, leaf_hash BLOB NOT NULL)",
    "CREATE UNIQUE INDEX entries_by_leaf_hash ON entries(leaf_hash)",
    "CREATE TABLE nodes (level INTEGER NOT NULL, idx INTEGER NOT NULL, hash BLOB NOT NULL,"
    " PRIMARY KEY (level, idx)) WITHOUT ROWID",
    "CREATE TABLE checkpoints (seq INTEGER PRIMARY KEY, size INTEGER NOT NULL, created_ms INTEGER NOT NULL,"
    " note TEXT NOT NULL)",
    "CREATE TABLE key_seq (public_key BLOB PRIMARY KEY, last_seq INTEGER NOT NULL, last_idx INTEGER NOT NULL)"
    " WITHOUT ROWID",
] + [
    f"CREATE TRIGGER {table}_no_{op} BEFORE {op.upper()} ON {table}"
    " BEGIN SELECT RAISE(ABORT, 'the MANTA ledger is append-only'); END"
    for table in ("entries", "nodes", "checkpoints", "meta")
    for op in ("update", "delete")
]


def check_sqlite_file(path: Path) -> None:
    """Refuse, with one line, a file that is not an intact SQLite database (cheap header checks).

    Raises :class:`LedgerError` if ``path`` cannot be read, is not SQLite, has an invalid page size,
    is not a whole number of pages, or is shorter than the page count its header records. The count
    is compared only when no write-ahead log is beside the file: a checkpoint in progress may write
    the header before the pages.
    """
    try:
        size = path.stat().st_size
        with path.open("rb") as fh:
            header = fh.read(100)
    except OSError as exc:
        raise LedgerError(f"cannot read ledger {path}: {exc.strerror or exc}") from None
    if len(header) < 100 or not header.startswith(_SQLITE_MAGIC):
        raise LedgerError(f"{path} is not a MANTA ledger (not an SQLite database)")
    page_size = struct.unpack(">H", header[16:18])[0]
    page_size = 65536 if page_size == 1 else page_size
    (change_counter,) = struct.unpack(">I", header[24:28])
    (page_count,) = struct.unpack(">I", header[28:32])
    (valid_for,) = struct.unpack(">I", header[92:96])
    if page_size < 512 or page_size & (page_size - 1):
        raise LedgerError(f"{path} is corrupted (invalid page size in its header)")
    if size % page_size:
        raise LedgerError(f"{path} is truncated or corrupted ({size} bytes, not a whole number of pages)")
    if not _wal_in_use(path) and valid_for == change_counter and size < page_count * page_size:
        raise LedgerError(f"{path} is truncated ({size} bytes, its header says {page_count * page_size})")


def connect_readonly(path: str | os.PathLike[str]) -> sqlite3.Connection:
    """A plain SQLite connection that cannot write the file (auditors, verify's worker processes)."""
    return sqlite3.connect(f"{Path(path).resolve().as_uri()}?mode=ro", uri=True, isolation_level=None)


def _wal_in_use(path: Path) -> bool:
    try:
        return path.with_name(path.name + "-wal").stat().st_size > 0
    except OSError:
        return False


def create_schema(conn: sqlite3.Connection, origin: str, log_public_key: bytes) -> None:
    """Create the tables of an empty ledger in WAL mode, in one transaction, naming the log
    ``origin`` signed by ``log_public_key``. Raises :class:`LedgerError` for a key that is not 32
    bytes and ``ValueError`` for an invalid origin; nothing is created then."""
    Checkpoint(origin=origin, size=0, root=EMPTY_ROOT.hex())  # validates the origin
    if len(log_public_key) != 32:
        raise LedgerError("the log's public key is 32 bytes")
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute(f"PRAGMA application_id={APPLICATION_ID}")
        conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        for statement in _SCHEMA:
            conn.execute(statement)
        conn.executemany(
            "INSERT INTO meta(key, value) VALUES (?, ?)",
            [
                ("origin", origin),
                ("log_public_key", log_public_key.hex()),
                ("created_ms", str(int(time.time() * 1000))),
            ],
        )
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def read_meta(conn: sqlite3.Connection, file: Path) -> dict[str, str]:
    """The ``meta`` table of the ledger ``file`` (at least ``origin`` and ``log_public_key``).
    Raises :class:`LedgerError` for a foreign database, another schema version or an incomplete
    table; ``sqlite3.DatabaseError`` for a damaged file."""
    (app_id,) = conn.execute("PRAGMA application_id").fetchone()
    (version,) = conn.execute("PRAGMA user_version").fetchone()
    if app_id != APPLICATION_ID:
        raise LedgerError(f"{file} is an SQLite database but not a MANTA ledger")
    if version != SCHEMA_VERSION:
        raise LedgerError(f"{file} has ledger schema version {version}; this MANTA reads {SCHEMA_VERSION}")
    meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
    if not {"origin", "log_public_key"} <= meta.keys():
        raise LedgerError(f"{file} is corrupted (its meta table is incomplete)")
    return meta
