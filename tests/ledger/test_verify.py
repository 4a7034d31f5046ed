"""verify_ledger: an intact ledger passes; each kind of alteration is found and named."""

from __future__ import annotations

import sqlite3

import pytest

from ledger.store import LedgerStore
from ledger.verify import verify_ledger
from protocol.identity import Identity
from protocol.merkle import MerkleFrontier, leaf_hash
from protocol.records import Revocation
from protocol.sealing import make_sealed
from tests.ledger.helpers import AGGREGATOR, PEERS, build_ledger, tamper
from tests.protocol.factories import resign


@pytest.fixture
def ledger(tmp_path):
    path = tmp_path / "ledger.db"
    build_ledger(path, batches=6, revoke=4)  # 30 receipts, a revocation: 31 entries, 7 checkpoints
    return path


@pytest.mark.parametrize("jobs", [1, 3])
def test_an_intact_ledger_verifies(ledger, jobs):
    result = verify_ledger(ledger, jobs=jobs)
    assert result.ok, result.summary
    assert (result.entries, result.checkpoints) == (31, 7)
    assert result.summary.startswith(f"OK: {ledger}: 31 entries, 7 checkpoints, root ")
    assert "\n" not in result.summary
    with LedgerStore.open(ledger, readonly=True) as store:
        assert result.root == store.root()
    assert verify_ledger(ledger, log_public_key=AGGREGATOR.public_key).summary.endswith("(pinned)")


def _data(path, index) -> bytes:
    conn = sqlite3.connect(path)
    (data,) = conn.execute("SELECT data FROM entries WHERE idx = ?", (index,)).fetchone()
    conn.close()
    return data


@pytest.mark.parametrize("jobs", [1, 3])
def test_an_altered_entry_is_named(ledger, jobs):
    altered = _data(ledger, 17).replace(b'"samples":100', b'"samples":999')
    tamper(ledger, "UPDATE entries SET data = ? WHERE idx = 17", params=(altered,))
    result = verify_ledger(ledger, jobs=jobs)
    assert not result.ok and result.problem_entry == 17
    assert "entry 17" in result.summary and "bad_signature" in result.summary


def test_an_altered_leaf_hash_is_named(ledger):
    tamper(ledger, "UPDATE entries SET leaf_hash = ? WHERE idx = 9", params=(b"\x00" * 32,))
    result = verify_ledger(ledger)
    assert not result.ok and result.problem_entry == 9 and "leaf hash" in result.summary


def test_a_validly_resigned_entry_with_rebuilt_hashes_is_caught_by_the_signed_checkpoints(ledger):
    """A forger holding a peer's key rewrites its entry, leaf hash and the whole hash tree consistently."""
    index = 12  # peer 2's receipt in round 2 (third batch: entries 10..14)
    original = _data(ledger, index)
    forged = resign(original, PEERS[2], original.split(b"\n")[1].replace(b'"samples":100', b'"samples":900'))
    conn = sqlite3.connect(ledger)
    leaves = [row[0] for row in conn.execute("SELECT leaf_hash FROM entries ORDER BY idx")]
    conn.close()
    leaves[index] = leaf_hash(forged)
    frontier, nodes = MerkleFrontier(), []
    for leaf in leaves:
        nodes += frontier.append(leaf)
    tamper(
        ledger,
        "DELETE FROM nodes",
        "UPDATE entries SET data = ?, leaf_hash = ? WHERE idx = 12",
        params=(forged, leaf_hash(forged)),
    )
    conn = sqlite3.connect(ledger)
    conn.executemany("INSERT INTO nodes(level, idx, hash) VALUES (?, ?, ?)", nodes)
    conn.commit()
    conn.close()
    result = verify_ledger(ledger)
    assert not result.ok and result.problem_checkpoint == 3
    assert "checkpoint 3" in result.summary and "10..14" in result.summary


def test_an_altered_hash_tree_node_is_named(ledger):
    tamper(ledger, "UPDATE nodes SET hash = ? WHERE level = 2 AND idx = 3", params=(b"\x11" * 32,))
    result = verify_ledger(ledger)
    assert not result.ok and "entries 12..15" in result.summary


def test_an_altered_checkpoint_is_named(ledger):
    conn = sqlite3.connect(ledger)
    (note,) = conn.execute("SELECT note FROM checkpoints WHERE seq = 5").fetchone()
    conn.close()
    lines = note.split("\n")
    lines[1] = "24"
    tamper(ledger, "UPDATE checkpoints SET note = ? WHERE seq = 5", params=("\n".join(lines),))
    result = verify_ledger(ledger)
    assert not result.ok and result.problem_checkpoint == 5 and "checkpoint 5" in result.summary


def test_deleted_and_appended_rows_are_found(tmp_path):
    first = tmp_path / "a.db"
    build_ledger(first, batches=3)
    tamper(first, "DELETE FROM entries WHERE idx = 6")
    result = verify_ledger(first)
    assert not result.ok and result.problem_entry == 6 and "missing" in result.summary

    second = tmp_path / "b.db"
    build_ledger(second, batches=3)
    extra = make_sealed(
        Revocation(task_id="t", entry_index=0, entry_leaf_hash="00" * 32, reason="x", timestamp=1), AGGREGATOR
    ).wire
    tamper(
        second,
        "INSERT INTO entries(idx, data, leaf_hash) VALUES (15, ?, ?)",
        params=(extra, leaf_hash(extra)),
    )
    result = verify_ledger(second)
    assert not result.ok and result.problem_entry == 15

    third = tmp_path / "c.db"
    build_ledger(third, batches=3)
    tamper(third, "DELETE FROM checkpoints WHERE seq = 2")
    result = verify_ledger(third)
    assert not result.ok and "checkpoint 2" in result.summary and "missing" in result.summary


def test_a_pinned_key_must_be_the_ledgers(ledger):
    result = verify_ledger(ledger, log_public_key=Identity.generate().public_key)
    assert not result.ok and "pinned key" in result.summary


def test_replay_state_and_page_corruption_are_found(tmp_path):
    first = tmp_path / "a.db"
    build_ledger(first, batches=3)
    tamper(first, "UPDATE key_seq SET last_seq = 0")  # would let old receipts be replayed
    result = verify_ledger(first)
    assert not result.ok and "replay state" in result.summary

    second = tmp_path / "b.db"
    build_ledger(second, batches=3)
    data = bytearray(second.read_bytes())
    data[3 * 4096 + 100 : 4 * 4096] = b"\xff" * (4096 - 100)  # an interior page verify's queries never read
    second.write_bytes(bytes(data))
    result = verify_ledger(second)
    assert not result.ok and "SQLite file is corrupted" in result.summary and "\n" not in result.summary
