"""`manta-ledger` as a real console script on real SQLite files, intact, altered and broken."""

from __future__ import annotations

import json
import sqlite3
import subprocess

import pytest

from ledger.store import LedgerStore
from protocol.ledger_checkpoint import Checkpoint
from protocol.merkle import tree_root
from tests.helpers import console_script
from tests.ledger.helpers import AGGREGATOR, PEERS, build_ledger, tamper

COMMANDS = [["verify"], ["show"], ["head"], ["proof", "--index", "3"], ["rewards"], ["rewards", "--json"]]


def ledger_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [console_script("manta-ledger"), *args], capture_output=True, text=True, timeout=120
    )


@pytest.fixture
def ledger(tmp_path):
    path = tmp_path / "ledger.db"
    wires = build_ledger(path, batches=5, revoke=7)
    return path, wires


def test_verify_an_intact_ledger(ledger):
    path, wires = ledger
    done = ledger_cli("verify", str(path))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"OK: {path}: 26 entries, 6 checkpoints, root {tree_root(wires).hex()}")
    pinned = ledger_cli("verify", str(path), "--key", AGGREGATOR.public_key_hex, "--jobs", "2")
    assert pinned.returncode == 0 and "(pinned)" in pinned.stdout
    with LedgerStore.open(path, readonly=True) as store:
        vkey = store.vkey
    assert ledger_cli("verify", str(path), "--key", vkey).returncode == 0
    wrong = ledger_cli("verify", str(path), "--key", PEERS[0].public_key_hex)
    assert wrong.returncode == 1 and "pinned key" in wrong.stdout


def test_verify_names_an_entry_altered_with_sqlite3(ledger):
    path, _ = ledger
    conn = sqlite3.connect(path)
    (data,) = conn.execute("SELECT data FROM entries WHERE idx = 11").fetchone()
    conn.close()
    tamper(
        path,
        "UPDATE entries SET data = ? WHERE idx = 11",
        params=(data.replace(b'"samples":100', b'"samples":101'),),
    )
    done = ledger_cli("verify", str(path))
    assert done.returncode == 1
    assert done.stdout.startswith(f"FAILED: {path}: entry 11 ") and len(done.stdout.splitlines()) == 1
    assert "Traceback" not in done.stderr


def test_verify_names_an_altered_checkpoint(ledger):
    path, _ = ledger
    conn = sqlite3.connect(path)
    (note,) = conn.execute("SELECT note FROM checkpoints WHERE seq = 2").fetchone()
    conn.close()
    tamper(path, "UPDATE checkpoints SET note = ? WHERE seq = 2", params=(note.replace("\n10\n", "\n9\n"),))
    done = ledger_cli("verify", str(path))
    assert done.returncode == 1 and "checkpoint 2" in done.stdout


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
@pytest.mark.parametrize("damage", ["missing", "truncated", "garbage", "foreign"])
def test_broken_files_are_one_line_errors(tmp_path, ledger, command, damage):
    path, _ = ledger
    if damage == "missing":
        path = tmp_path / "absent.db"
    elif damage == "truncated":
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
    elif damage == "garbage":
        path.write_bytes(bytes(range(256)) * 64)
    else:
        path = tmp_path / "other.db"
        sqlite3.connect(path).execute("CREATE TABLE entries(x)").connection.commit()
    done = ledger_cli(command[0], str(path), *command[1:])
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), done.stderr


def test_head_prints_the_latest_signed_checkpoint(ledger):
    path, wires = ledger
    done = ledger_cli("head", str(path))
    assert done.returncode == 0, done.stderr
    head = Checkpoint.from_note(done.stdout, AGGREGATOR.public_key)
    assert head.size == 26 and head.root_bytes == tree_root(wires)


def test_proof_prints_and_checks_an_inclusion_proof(ledger):
    path, wires = ledger
    done = ledger_cli("proof", str(path), "--index", "13")
    assert done.returncode == 0, done.stderr
    assert "entry 13 of 26" in done.stdout
    assert "inclusion proof (5 hashes, RFC 9162 order):" in done.stdout
    assert done.stdout.rstrip().endswith("OK: the entry is included under the signed checkpoint")
    from protocol.merkle import inclusion_proof

    for h in inclusion_proof(wires, 13):
        assert f"  {h.hex()}" in done.stdout
    missing = ledger_cli("proof", str(path), "--index", "26")
    assert missing.returncode == 1 and missing.stderr.startswith("Error: no entry 26")


def test_proof_fails_when_the_entry_was_altered(ledger):
    path, _ = ledger
    tamper(path, "UPDATE entries SET data = data || x'20' WHERE idx = 4")
    done = ledger_cli("proof", str(path), "--index", "4")
    assert done.returncode == 1 and "FAILED" in done.stdout


def test_show_lists_entries(ledger):
    path, _ = ledger
    done = ledger_cli("show", str(path), "--start", "20", "--limit", "10")
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if line.strip()[:2].strip().isdigit()]
    assert len(rows) == 6
    assert "revokes entry 7: failed audit" in done.stdout
    as_json = ledger_cli("show", str(path), "--json", "--limit", "2")
    records = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert [r["index"] for r in records] == [0, 1] and records[0]["kind"] == "receipt"
    assert records[0]["record"]["samples"] == 100


def test_rewards_table_and_json(ledger):
    path, _ = ledger
    done = ledger_cli("rewards", str(path), "--json")
    assert done.returncode == 0, done.stderr
    table = json.loads(done.stdout)
    assert table["receipts"] == 25 and table["revocations"] == 1
    by_fp = {p["fingerprint"]: p for p in table["peers"]}
    assert by_fp[PEERS[2].fingerprint]["credits"] == 4 * 100 * 3_000_000  # entry 7 (peer 2, round 1) revoked
    assert by_fp[PEERS[2].fingerprint]["revoked"] == 1
    assert sum(p["share"] for p in table["peers"]) == pytest.approx(1.0)
    text = ledger_cli("rewards", str(path))
    assert text.returncode == 0 and PEERS[4].fingerprint in text.stdout and "share" in text.stdout


def test_verify_reports_a_corrupted_page_in_one_line(ledger):
    path, _ = ledger
    data = bytearray(path.read_bytes())
    middle = (len(data) // 4096 // 2) * 4096
    data[middle : middle + 4096] = b"\xff" * 4096
    path.write_bytes(bytes(data))
    done = ledger_cli("verify", str(path))
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    output = (done.stdout + done.stderr).strip().splitlines()
    assert len(output) == 1 and ("FAILED" in output[0] or output[0].startswith("Error: ")), output


def test_verify_against_a_pinned_checkpoint_finds_removed_batches(ledger, tmp_path):
    """An auditor kept the head note; later the last batch and its checkpoints are removed with
    sqlite3. The shortened ledger still verifies on its own, but not against the pinned note."""
    path, _ = ledger
    pinned = tmp_path / "pinned.note"
    pinned.write_text(ledger_cli("head", str(path)).stdout)
    kept = ledger_cli("verify", str(path), "--checkpoint", str(pinned))
    assert kept.returncode == 0 and "consistent with the pinned checkpoint" in kept.stdout, kept.stdout
    with LedgerStore.open(path, readonly=True) as store:
        cut = list(store.checkpoints())[-2].checkpoint.size  # the size before the last batch
    tamper(
        path,
        "DELETE FROM entries WHERE idx >= ?",
        "DELETE FROM nodes WHERE (idx + 1) * (1 << level) > ?",  # subtrees reaching past the cut
        "DELETE FROM checkpoints WHERE size > ?",
        params=(cut,),
    )
    alone = ledger_cli("verify", str(path))
    assert alone.returncode == 0, alone.stdout + alone.stderr  # the attack: it verifies on its own
    against = ledger_cli("verify", str(path), "--checkpoint", str(pinned))
    assert against.returncode == 1 and "entries were removed" in against.stdout, against.stdout
    other = tmp_path / "other.note"
    other.write_text(pinned.read_text().replace("\n\n", "\nextra line\n\n", 1))  # its signature breaks
    forged = ledger_cli("verify", str(path), "--checkpoint", str(other))
    assert forged.returncode == 1 and "not a note signed by the log's key" in forged.stdout, forged.stdout
