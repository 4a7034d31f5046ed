"""Full audit of a ledger file: everything is recomputed from the entries' bytes.

``verify_ledger(path, log_public_key=None, jobs=1, progress=None) -> VerifyResult`` checks, in order,
and stops at the first problem, which it names:

0. the SQLite file's structure (``PRAGMA quick_check``);
1. every entry: a well-formed, canonical ledger record (receipt or revocation) whose signature
   verifies, whose stored leaf hash is ``H(0x00 || bytes)``, receipts' sequence numbers rising per
   key, revocations sealed by the log key and naming an earlier receipt by its leaf hash; entry
   indices contiguous; and the durable replay state (last seq per key) equal to what the entries say;
2. the stored hash tree: every node equals the hash of its children recomputed from the leaves;
3. every checkpoint: its C2SP signature by the log key, origin, a size that never shrinks, its root
   equal to the recomputed root at its size, an RFC 9162 consistency proof from the previous
   checkpoint that verifies, and the last one covering every entry.

The per-entry checks (dominated by Ed25519 verification) can be spread over ``jobs``
processes, each reading its own index range of the file; the tree and checkpoint checks run in the
calling process. ``log_public_key`` pins the aggregator's key; without it the key recorded in the file
is used (and the summary says so).
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ledger.errors import LedgerError
from ledger.sqlite_file import connect_readonly
from ledger.store import LedgerStore
from protocol.identity import fingerprint
from protocol.ledger_checkpoint import Checkpoint
from protocol.merkle import (
    consistency_path,
    fold_subtrees,
    leaf_hash,
    node_hash,
    perfect_subtrees,
    verify_consistency,
)
from protocol.note import NoteError
from protocol.records import LEDGER_ENTRY_TYPES, ContributionReceipt, Revocation
from protocol.sealing import RecordRejected, open_sealed

Progress = Callable[[int, int], None]
_RECEIPT, _REVOCATION = ord("r"), ord("v")


@dataclass(frozen=True)
class VerifyResult:
    ok: bool
    summary: str  # one line
    entries: int
    checkpoints: int
    root: bytes
    problem_entry: int | None = None
    problem_checkpoint: int | None = None


@dataclass
class _Chunk:
    """What a worker learned about entries ``[lo, hi)`` (up to its first problem)."""

    lo: int
    hi: int
    leaves: bytes = b""  # 32 bytes per entry checked
    kinds: bytes = b""  # one byte per entry: r(eceipt) or v (revocation)
    problem: tuple[int, str] | None = None
    keys: dict[bytes, tuple[int, int, int, int]] = field(default_factory=dict)  # first idx/seq, last idx/seq
    revocations: list[tuple[int, int, bytes]] = field(default_factory=list)  # (idx, target, target leaf)


def _check_chunk(path: str, lo: int, hi: int, log_key: bytes) -> _Chunk:
    out = _Chunk(lo, hi)
    leaves, kinds = bytearray(), bytearray()
    conn = connect_readonly(path)
    try:
        expected = lo
        rows = conn.execute(
            "SELECT idx, data, leaf_hash FROM entries WHERE idx >= ? AND idx < ? ORDER BY idx", (lo, hi)
        )
        for idx, data, stored_leaf in rows:
            if idx != expected:
                out.problem = (expected, f"entry {expected} is missing")
                break
            expected += 1
            try:
                sealed = open_sealed(data, LEDGER_ENTRY_TYPES)
            except RecordRejected as exc:
                out.problem = (
                    idx,
                    f"entry {idx} is not a valid signed record ({exc.reason.value}: {exc.detail})",
                )
                break
            leaf = leaf_hash(data)
            if leaf != stored_leaf:
                out.problem = (idx, f"entry {idx}: its stored leaf hash does not match its bytes")
                break
            record = sealed.record
            if isinstance(record, ContributionReceipt):
                key = sealed.public_key
                seen = out.keys.get(key)
                if seen is not None and record.seq <= seen[3]:
                    out.problem = (
                        idx,
                        f"entry {idx}: sequence number {record.seq} of key {fingerprint(key)} does not follow "
                        f"{seen[3]} of entry {seen[2]}",
                    )
                    break
                out.keys[key] = (
                    (idx, record.seq, idx, record.seq) if seen is None else (*seen[:2], idx, record.seq)
                )
                kinds.append(_RECEIPT)
            else:
                assert isinstance(record, Revocation)
                if sealed.public_key != log_key:
                    out.problem = (idx, f"entry {idx}: a revocation not sealed by the log key")
                    break
                if record.entry_index >= idx:
                    out.problem = (idx, f"entry {idx}: a revocation of the later entry {record.entry_index}")
                    break
                out.revocations.append((idx, record.entry_index, bytes.fromhex(record.entry_leaf_hash)))
                kinds.append(_REVOCATION)
            leaves += leaf
        else:
            if expected != hi:
                out.problem = (expected, f"entry {expected} is missing")
    finally:
        conn.close()
    out.leaves, out.kinds = bytes(leaves), bytes(kinds)
    return out


def _check_chunk_star(args: tuple[str, int, int, bytes]) -> _Chunk:
    return _check_chunk(*args)


def default_jobs() -> int:
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, 8))


def verify_ledger(
    path: str | os.PathLike[str],
    *,
    log_public_key: bytes | None = None,
    jobs: int = 1,
    progress: Progress | None = None,
) -> VerifyResult:
    """Audit the ledger at ``path``; LedgerError if it cannot be read at all (missing, not a ledger)."""
    with LedgerStore.open(path, readonly=True) as store:
        origin, recorded_key = store.origin, store.log_public_key
    file = str(Path(path).expanduser())
    key = log_public_key or recorded_key
    key_note = "pinned" if log_public_key else "as recorded in the file"
    try:
        return _verify(file, origin, key, recorded_key, key_note, jobs, progress)
    except sqlite3.DatabaseError as exc:
        raise LedgerError(f"{file} is corrupted ({exc})") from None


def _verify(
    file: str,
    origin: str,
    key: bytes,
    recorded_key: bytes,
    key_note: str,
    jobs: int,
    progress: Progress | None,
) -> VerifyResult:
    def failed(
        message: str, *, entry: int | None = None, checkpoint: int | None = None, n: int = 0
    ) -> VerifyResult:
        return VerifyResult(False, f"FAILED: {file}: {message}", n, 0, b"", entry, checkpoint)

    if key != recorded_key:
        return failed(
            f"the file names log key {fingerprint(recorded_key)}, not the pinned key {fingerprint(key)}",
            checkpoint=0,
        )
    conn = connect_readonly(file)
    try:
        damage = [row[0] for row in conn.execute("PRAGMA quick_check(1)")]
        if damage != ["ok"]:
            detail = " ".join(damage[0].replace("*** in database main ***", "").split())
            return failed(f"the SQLite file is corrupted ({detail})")
        (top,) = conn.execute("SELECT max(idx) FROM entries").fetchone()
        n = 0 if top is None else top + 1
        chunk = max(1000, min(50_000, n // (max(jobs, 1) * 8) + 1))
        tasks = [(file, lo, min(lo + chunk, n), key) for lo in range(0, n, chunk)]
        leaves, kinds = bytearray(), bytearray()
        keys: dict[bytes, tuple[int, int]] = {}  # last idx, last seq
        revocations: list[tuple[int, int, bytes]] = []
        problems: list[tuple[int, str]] = []
        for part in _run_chunks(tasks, jobs):
            for k, (first_idx, first_seq, last_idx, last_seq) in part.keys.items():
                seen = keys.get(k)
                if seen is not None and first_seq <= seen[1]:
                    problems.append(
                        (
                            first_idx,
                            f"entry {first_idx}: sequence number {first_seq} of key {fingerprint(k)} "
                            f"does not follow {seen[1]} of entry {seen[0]}",
                        )
                    )
                keys[k] = (last_idx, last_seq)
            leaves += part.leaves
            kinds += part.kinds
            revocations += part.revocations
            if part.problem:
                problems.append(part.problem)
            if problems:
                break
            if progress:
                progress(part.hi, n)
        for idx, target, target_leaf in revocations:
            if kinds[target] != _RECEIPT or leaves[32 * target : 32 * target + 32] != target_leaf:
                problems.append((idx, f"entry {idx}: revokes entry {target}, which is not that receipt"))
        if problems:
            idx, message = min(problems)
            return failed(message, entry=idx, n=n)
        problem = _check_replay_state(conn, keys)
        if problem:
            return failed(problem, n=n)

        levels = _build_levels(bytes(leaves), n)
        problem = _check_nodes(conn, levels)
        if problem:
            return failed(problem, entry=None, n=n)
        return _check_checkpoints(conn, file, origin, key, key_note, levels, n)
    finally:
        conn.close()


def _check_replay_state(conn: sqlite3.Connection, keys: dict[bytes, tuple[int, int]]) -> str | None:
    """The durable per-key sequence state must be exactly what the entries say (else replays could pass)."""
    stored = {
        key: (idx, seq)
        for key, seq, idx in conn.execute("SELECT public_key, last_seq, last_idx FROM key_seq")
    }
    for key in sorted(stored.keys() | keys.keys()):
        if stored.get(key) != keys.get(key):
            said, actual = stored.get(key), keys.get(key)
            return (
                f"the replay state of key {fingerprint(key)} says last seq/entry {said and (said[1], said[0])}, "
                f"the entries say {actual and (actual[1], actual[0])}"
            )
    return None


def _run_chunks(tasks: list[tuple[str, int, int, bytes]], jobs: int):
    if jobs <= 1 or len(tasks) <= 1:
        for task in tasks:
            yield _check_chunk(*task)
        return
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(min(jobs, len(tasks))) as pool:
        yield from pool.imap(_check_chunk_star, tasks)


def _build_levels(leaves: bytes, n: int) -> list[list[bytes]]:
    """Every perfect-subtree hash, level by level (level 0 = leaf hashes)."""
    levels = [[leaves[i : i + 32] for i in range(0, 32 * n, 32)]]
    while len(levels[-1]) > 1:
        below = levels[-1]
        levels.append([node_hash(below[i], below[i + 1]) for i in range(0, len(below) - 1, 2)])
    return levels


def _check_nodes(conn: sqlite3.Connection, levels: list[list[bytes]]) -> str | None:
    counts = dict(conn.execute("SELECT level, count(*) FROM nodes GROUP BY level").fetchall())
    for level in range(1, max([len(levels) - 1, *counts.keys()]) + 1):
        expected = levels[level] if level < len(levels) else []
        rows = conn.execute("SELECT idx, hash FROM nodes WHERE level = ? ORDER BY idx", (level,))
        for position, (idx, stored) in enumerate(rows):
            if position >= len(expected) or idx != position:
                return f"the hash tree has a node {level}/{idx} that no entries make"
            if stored != expected[position]:
                lo, hi = idx << level, ((idx + 1) << level) - 1
                return f"the stored hash over entries {lo}..{hi} (node {level}/{idx}) does not match those entries"
        if counts.get(level, 0) != len(expected):
            return f"the hash tree lacks nodes at level {level} ({counts.get(level, 0)} of {len(expected)})"
    return None


def _subtree_hash(levels: list[list[bytes]], lo: int, hi: int) -> bytes:
    return fold_subtrees([levels[level][index] for level, index in perfect_subtrees(lo, hi)])


def _check_checkpoints(
    conn: sqlite3.Connection,
    file: str,
    origin: str,
    key: bytes,
    key_note: str,
    levels: list[list[bytes]],
    n: int,
) -> VerifyResult:
    def failed(seq: int, message: str) -> VerifyResult:
        return VerifyResult(False, f"FAILED: {file}: checkpoint {seq}: {message}", n, seq - 1, b"", None, seq)

    subtree_hash = functools.partial(_subtree_hash, levels)
    prev: Checkpoint | None = None
    count = 0
    for seq, note in conn.execute("SELECT seq, note FROM checkpoints ORDER BY seq"):
        count += 1
        if seq != count:
            return failed(count, "is missing")
        try:
            head = Checkpoint.from_note(note, key, origin)
        except (NoteError, ValueError) as exc:
            return failed(seq, f"its signature or text is not valid ({exc})")
        if head.origin != origin:
            return failed(seq, f"is for origin {head.origin}, not {origin}")
        if head.size > n:
            return failed(seq, f"claims {head.size} entries, the ledger has {n}")
        prev_size = prev.size if prev else 0
        if head.size < prev_size:
            return failed(seq, f"shrinks the log from {prev_size} to {head.size} entries")
        if _subtree_hash(levels, 0, head.size) != head.root_bytes:
            return failed(
                seq,
                f"its root does not match the entries (size {head.size}); an entry in {prev_size}..{head.size - 1} "
                "was altered",
            )
        if prev is not None and prev.size > 0:
            proof = consistency_path(prev.size, head.size, subtree_hash)
            if not verify_consistency(prev.size, head.size, prev.root_bytes, head.root_bytes, proof):
                return failed(seq, f"is not consistent with checkpoint {seq - 1}")
        prev = head
    covered = prev.size if prev else 0
    if covered != n:
        return VerifyResult(
            False,
            f"FAILED: {file}: entry {covered}: entries {covered}..{n - 1} are not covered by any signed checkpoint",
            n,
            count,
            b"",
            covered,
            None,
        )
    root = _subtree_hash(levels, 0, n)
    return VerifyResult(
        True,
        f"OK: {file}: {n} entries, {count} checkpoints, root {root.hex()}, log {origin} "
        f"key {fingerprint(key)} ({key_note})",
        n,
        count,
        root,
    )
