"""The ledger's Merkle tree as stored: leaf hashes in ``entries``, and in ``nodes`` the hash of every
complete perfect subtree above them, so any RFC 9162 subtree of any tree size is a fold of O(log n)
stored hashes (proofs and historic roots in O(log n) primary-key reads)."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path

from ledger.errors import LedgerError
from protocol.merkle import MerkleFrontier, fold_subtrees, frontier_subtrees, perfect_subtrees


def stored_node(conn: sqlite3.Connection, level: int, index: int) -> bytes | None:
    """The hash of subtree ``index`` at ``level`` (level 0: the leaf hash of entry ``index``), or
    None if it is not stored."""
    if level == 0:
        row = conn.execute("SELECT leaf_hash FROM entries WHERE idx = ?", (index,)).fetchone()
    else:
        row = conn.execute("SELECT hash FROM nodes WHERE level = ? AND idx = ?", (level, index)).fetchone()
    return None if row is None else row[0]


def load_frontier(conn: sqlite3.Connection, path: Path) -> MerkleFrontier:
    """The frontier of the whole stored tree, restored from O(log n) rows. Raises
    :class:`LedgerError` (naming ``path``) if a subtree hash it needs is missing."""
    (top,) = conn.execute("SELECT max(idx) FROM entries").fetchone()
    size = 0 if top is None else top + 1
    hashes = []
    for level, index in frontier_subtrees(size):
        found = stored_node(conn, level, index)
        if found is None:
            raise LedgerError(f"{path} is corrupted (hash of subtree {level}/{index} missing)")
        hashes.append(found)
    return MerkleFrontier.from_hashes(size, hashes)


def subtree_hasher(conn: sqlite3.Connection, path: Path) -> Callable[[int, int], bytes]:
    """``subtree_hash(lo, hi)`` over stored nodes, memoized for one proof (O(log n) reads in all);
    it raises :class:`LedgerError` (naming ``path``) if a stored hash it needs is missing."""
    memo: dict[tuple[int, int], bytes] = {}

    def stored(level: int, index: int) -> bytes:
        key = (level, index)
        found = memo.get(key)
        if found is None:
            found = stored_node(conn, level, index)
            if found is None:
                raise LedgerError(f"{path} is corrupted (hash of subtree {level}/{index} missing)")
            memo[key] = found
        return found

    def subtree_hash(lo: int, hi: int) -> bytes:
        return fold_subtrees([stored(level, index) for level, index in perfect_subtrees(lo, hi)])

    return subtree_hash
