"""LedgerStore: append-only SQLite Merkle log with signed C2SP checkpoints."""

from __future__ import annotations

import random
import sqlite3

import pytest

from ledger.errors import LedgerError
from ledger.store import LedgerStore
from protocol.identity import Identity
from protocol.ledger_checkpoint import Checkpoint
from protocol.merkle import (
    consistency_proof,
    inclusion_proof,
    leaf_hash,
    tree_root,
    verify_consistency,
    verify_inclusion,
)
from protocol.note import open_note, parse_vkey
from protocol.records import Revocation
from protocol.sealing import make_sealed
from tests.ledger.helpers import AGGREGATOR, ORIGIN, PEERS, build_ledger
from tests.protocol.factories import sealed_receipt


@pytest.fixture
def store(tmp_path):
    with LedgerStore.open(
        tmp_path / "ledger.db", create=True, origin=ORIGIN, log_public_key=AGGREGATOR.public_key
    ) as s:
        yield s


def test_new_ledger_is_wal_full_sync_and_empty(store):
    assert store.size == 0 and store.root() == tree_root([])
    assert store.latest_checkpoint() is None
    conn = store._conn
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL


def test_batches_match_the_pure_merkle_functions(tmp_path):
    wires = build_ledger(tmp_path / "l.db", batches=5)
    with LedgerStore.open(tmp_path / "l.db") as store:
        assert store.size == len(wires) == 25
        assert store.root() == tree_root(wires)
        assert [store.entry(i) for i in range(store.size)] == wires
        assert [d for _, d in store.entries()] == wires
        for size in range(1, 26):
            assert store.root_at(size) == tree_root(wires[:size])
            for index in range(size):
                proof = store.inclusion_proof(index, size)
                assert proof == inclusion_proof(wires[:size], index)
                assert verify_inclusion(wires[index], index, size, proof, store.root_at(size))
            for old in range(1, size + 1):
                assert store.consistency_proof(old, size) == consistency_proof(wires[:size], old)


def test_every_batch_gets_a_checkpoint_signed_in_c2sp_format(tmp_path):
    wires = build_ledger(tmp_path / "l.db", batches=3)
    with LedgerStore.open(tmp_path / "l.db", readonly=True) as store:
        heads = list(store.checkpoints())
        assert [h.size for h in heads] == [5, 10, 15]
        name, key = parse_vkey(store.vkey)
        assert (name, key) == (ORIGIN, AGGREGATOR.public_key)
        for head in heads:
            text = open_note(head.note, name, key)
            assert (
                text
                == f"{ORIGIN}\n{head.size}\n"
                + __import__("base64").b64encode(tree_root(wires[: head.size])).decode()
                + "\n"
            )
            assert Checkpoint.from_note(head.note, key) == head.checkpoint
        for before, after in zip(heads, heads[1:], strict=False):
            proof = store.consistency_proof(before.size, after.size)
            assert verify_consistency(
                before.size, after.size, before.checkpoint.root_bytes, after.checkpoint.root_bytes, proof
            )
        assert store.latest_checkpoint() == heads[-1]


def test_proofs_read_o_log_n_rows(tmp_path):
    path = tmp_path / "big.db"
    with LedgerStore.open(path, create=True, origin=ORIGIN, log_public_key=AGGREGATOR.public_key) as store:
        peers = [Identity.generate() for _ in range(8)]
        for round_ in range(500):  # 4000 entries
            store.append_batch([sealed_receipt(p, round_ + 1, round=round_) for p in peers], AGGREGATOR)
        statements = []
        store._conn.set_trace_callback(statements.append)
        rng = random.Random(1)
        for index in rng.sample(range(store.size), 50):
            statements.clear()
            proof = store.inclusion_proof(index)
            assert verify_inclusion(store.entry(index), index, store.size, proof, store.root())
            reads = [s for s in statements if s.startswith("SELECT")]
            assert len(reads) <= 2 * store.size.bit_length(), len(reads)  # log2(4000) ~ 12
        statements.clear()
        store.consistency_proof(1234, 3999)
        assert len([s for s in statements if s.startswith("SELECT")]) <= 2 * store.size.bit_length()


def test_reopening_restores_state_and_replays_stay_refused(tmp_path):
    path = tmp_path / "l.db"
    wires = build_ledger(path, batches=2)
    with LedgerStore.open(path) as store:
        assert store.root() == tree_root(wires)
        assert store.last_seq(PEERS[0].public_key) == 2
        with pytest.raises(LedgerError, match="not above its last one"):
            store.append_batch([sealed_receipt(PEERS[0], 2, round=9)], AGGREGATOR)
        with pytest.raises(LedgerError, match="not above its last one"):
            store.append_batch([sealed_receipt(PEERS[1], 1, round=0)], AGGREGATOR)  # an old sequence number
        store.append_batch([sealed_receipt(PEERS[0], 3)], AGGREGATOR)
        assert store.size == len(wires) + 1


def test_a_refused_batch_writes_nothing(tmp_path):
    path = tmp_path / "l.db"
    build_ledger(path, batches=1)
    with LedgerStore.open(path) as store:
        size, root, heads = store.size, store.root(), len(list(store.checkpoints()))
        fresh = Identity.generate()
        batch = [
            sealed_receipt(fresh, 1),
            sealed_receipt(PEERS[1], 5),
            sealed_receipt(PEERS[2], 1),
        ]  # 3rd: replayed seq
        with pytest.raises(LedgerError):
            store.append_batch(batch, AGGREGATOR)
        assert (store.size, store.root(), len(list(store.checkpoints()))) == (size, root, heads)
        assert store.last_seq(fresh.public_key) is None and store.last_seq(PEERS[1].public_key) == 1
        store.append_batch(batch[:2], AGGREGATOR)  # the same entries are fine on their own
    with LedgerStore.open(path) as store:
        assert store.size == size + 2


def test_entries_nodes_and_checkpoints_cannot_be_rewritten(store):
    store.append_batch([sealed_receipt(PEERS[0], 1), sealed_receipt(PEERS[1], 1)], AGGREGATOR)
    for statement in [
        "UPDATE entries SET data = x'00' WHERE idx = 0",
        "DELETE FROM entries WHERE idx = 1",
        "UPDATE nodes SET hash = x'00'",
        "DELETE FROM checkpoints",
        "UPDATE meta SET value = 'x' WHERE key = 'origin'",
    ]:
        with pytest.raises(sqlite3.DatabaseError, match="append-only"):
            store._conn.execute(statement)


def test_only_the_log_key_signs_and_read_only_stores_do_not_write(tmp_path, store):
    with pytest.raises(LedgerError, match="signed by"):
        store.append_batch([sealed_receipt(PEERS[0], 1)], PEERS[0])
    store.append_batch([], AGGREGATOR)  # an empty round still gets a checkpoint
    assert store.latest_checkpoint().size == 0
    store.close()
    with LedgerStore.open(store.path, readonly=True) as ro:
        with pytest.raises(LedgerError, match="read-only"):
            ro.append_batch([], AGGREGATOR)


def test_revocations(tmp_path):
    path = tmp_path / "l.db"
    build_ledger(path, batches=2)
    with LedgerStore.open(path) as store:
        head = store.revoke(3, "failed audit", AGGREGATOR, task_id="t", now_ms=5)
        assert head.size == 11
        with pytest.raises(LedgerError, match="already in the ledger"):  # the same bytes twice
            store.revoke(3, "failed audit", AGGREGATOR, task_id="t", now_ms=5)
        revocation = Revocation(
            task_id="t", entry_index=1, entry_leaf_hash=store.leaf_hash(1).hex(), reason="x", timestamp=1
        )
        with pytest.raises(LedgerError, match="log's key"):
            store.append_batch([make_sealed(revocation, PEERS[0])], AGGREGATOR)
        wrong_leaf = revocation.model_copy(update={"entry_leaf_hash": store.leaf_hash(2).hex()})
        with pytest.raises(LedgerError, match="revoked leaf hash"):
            store.append_batch([make_sealed(wrong_leaf, AGGREGATOR)], AGGREGATOR)
        not_a_receipt = revocation.model_copy(
            update={"entry_index": 10, "entry_leaf_hash": store.leaf_hash(10).hex()}
        )
        with pytest.raises(LedgerError, match="only receipts"):
            store.append_batch([make_sealed(not_a_receipt, AGGREGATOR)], AGGREGATOR)
        later = revocation.model_copy(update={"entry_index": 11, "entry_leaf_hash": "00" * 32})
        with pytest.raises(LedgerError, match="earlier batch"):
            store.append_batch([sealed_receipt(PEERS[0], 9), make_sealed(later, AGGREGATOR)], AGGREGATOR)
        assert store.size == 11


@pytest.mark.parametrize(
    ("prepare", "message"),
    [
        (lambda p: None, "no ledger at"),
        (lambda p: p.write_bytes(b"hello, not a database" * 10), "not an SQLite database"),
        (lambda p: p.write_bytes(b""), "not an SQLite database"),
        (lambda p: sqlite3.connect(p).execute("CREATE TABLE t(x)").connection.commit(), "not a MANTA ledger"),
    ],
)
def test_unusable_files_are_one_line_errors(tmp_path, prepare, message):
    path = tmp_path / "ledger.db"
    prepare(path)
    with pytest.raises(LedgerError, match=message) as err:
        LedgerStore.open(path)
    assert "\n" not in str(err.value)


def test_a_truncated_file_is_refused_at_open(tmp_path):
    path = tmp_path / "l.db"
    build_ledger(path, batches=40)
    data = path.read_bytes()
    assert len(data) > 16 * 4096
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(LedgerError, match="truncated"):
        LedgerStore.open(path)
    path.write_bytes(data[: len(data) // 2 + 100])
    with pytest.raises(LedgerError, match="truncated or corrupted"):
        LedgerStore.open(path)


def test_creating_needs_origin_and_key_and_existing_ledgers_must_match(tmp_path):
    with pytest.raises(LedgerError, match="origin"):
        LedgerStore.open(tmp_path / "new.db", create=True)
    build_ledger(tmp_path / "l.db", batches=1)
    with pytest.raises(LedgerError, match="not of"):
        LedgerStore.open(tmp_path / "l.db", origin="manta.test/other")
    with pytest.raises(LedgerError, match="signed by key"):
        LedgerStore.open(tmp_path / "l.db", log_public_key=PEERS[0].public_key)
    with pytest.raises(LedgerError):
        LedgerStore.open(
            tmp_path / "missing-dir" / "x.db", create=True, origin=ORIGIN, log_public_key=b"\x00" * 32
        )


def test_leaf_hashes_are_stored_per_entry(tmp_path):
    wires = build_ledger(tmp_path / "l.db", batches=1)
    with LedgerStore.open(tmp_path / "l.db") as store:
        assert [store.leaf_hash(i) for i in range(store.size)] == [leaf_hash(w) for w in wires]
        assert store.index_of(leaf_hash(wires[3])) == 3
        with pytest.raises(LedgerError, match="no entry"):
            store.entry(5)
