"""`manta-peer credits`: the report a volunteer reads (FLOPs and GPU-hours, every proof checked
against a real signed ledger checkpoint), its JSON form, and the swarm it finds in the data directory.
The swarm-sized run (an aggregator answering a peer's request) is tests/aggregator/test_contributions_swarm.py
(slow).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

import pytest

from ledger.rewards import compute_rewards
from ledger.store import LedgerStore
from ledger.units import CREDIT_PER_GPU_HOUR, REFERENCE_DEVICE, REFERENCE_FP32_TFLOPS, gpu_hours
from peer.credits import check_credits, credits_json, format_credits
from peer.swarm_record import SwarmRecord, write_swarm_record
from protocol.identity import Identity
from protocol.merkle import leaf_hash
from protocol.records import LEDGER_ENTRY_TYPES, ContributionReceipt
from protocol.sealing import parse_sealed
from tests.helpers import console_script
from tests.ledger.helpers import AGGREGATOR, PEERS, build_ledger

ROOT = Path(__file__).resolve().parents[2]


def test_a_gpu_hour_is_an_hour_of_the_reference_device_in_multiply_adds_and_the_docs_say_so():
    assert REFERENCE_DEVICE == "NVIDIA T4" and REFERENCE_FP32_TFLOPS == 8.1
    assert CREDIT_PER_GPU_HOUR == 8.1e12 * 3600 / 2  # the vendor counts a multiply-add as 2 FLOPs
    assert gpu_hours(CREDIT_PER_GPU_HOUR) == 1.0
    volunteer = (ROOT / "docs" / "volunteer.md").read_text()
    assert "NVIDIA T4" in volunteer and "8.1 TFLOP/s" in volunteer and "1.458e16" in volunteer


def _reply(store: LedgerStore, key: str) -> dict:
    """What the aggregator answers a credits request with (aggregator/contributions.py), from a real ledger."""
    head = store.latest_checkpoint()
    entries = []
    for index, data in store.entries():
        sealed = parse_sealed(data, LEDGER_ENTRY_TYPES)
        if isinstance(sealed.record, ContributionReceipt) and sealed.public_key.hex() == key:
            r = sealed.record
            entries.append(
                {"index": index, "round": r.round, "seq": r.seq, "samples": r.samples, "credit": r.credit,
                 "revoked": False, "leaf_hash": leaf_hash(data).hex(), "checkpoint": head.note,
                 "proof": [h.hex() for h in store.inclusion_proof(index, head.size)]}
            )  # fmt: skip
    rewards = compute_rewards((d for _, d in store.entries()), AGGREGATOR.public_key)
    mine = next(p for p in rewards.peers if p.public_key == key)
    return {
        "entries": entries,
        "credits": mine.credits,
        "share": mine.share,
        "total_credits": rewards.total_credits,
    }


def test_the_report_checks_every_proof_and_gives_every_figure_in_both_units(tmp_path):
    build_ledger(tmp_path / "ledger.sqlite", batches=3)
    key = PEERS[1].public_key_hex
    with LedgerStore.open(tmp_path / "ledger.sqlite", readonly=True) as store:
        reply = _reply(store, key)
    (tmp_path / "peer" / "receipts" / "settled").mkdir(parents=True)
    report = {
        **check_credits(reply, AGGREGATOR.public_key_hex, "cifar10-ofa-test", tmp_path / "peer"),
        "key": key,
    }
    assert report["bad_proofs"] == 0 and len(report["entries"]) == 3
    assert all(e["proof_ok"] for e in report["entries"])

    shown = credits_json(report)
    json.dumps(shown)  # machine-readable as it is
    assert shown["aggregator"] == {
        "public_key": AGGREGATOR.public_key_hex,
        "fingerprint": AGGREGATOR.fingerprint,
    }
    assert shown["key"]["fingerprint"] == PEERS[1].fingerprint
    assert shown["credits"] == {
        "flops": reply["credits"],
        "gpu_hours": reply["credits"] / CREDIT_PER_GPU_HOUR,
    }
    assert shown["total_credits"]["gpu_hours"] == reply["total_credits"] / CREDIT_PER_GPU_HOUR
    assert reply["credits"] == sum(e["credit_flops"] for e in shown["entries"]) == 3 * 100 * 2_000_000
    for e in shown["entries"]:
        assert e["credit_gpu_hours"] == e["credit_flops"] / CREDIT_PER_GPU_HOUR and e["proof_ok"]
    assert shown["proofs_ok"] == 3 and shown["bad_proofs"] == 0 and shown["checkpoint_size"] == 15
    assert shown["outbox"] == {"pending": 0, "settled": 0, "rejected": 0}
    assert (
        shown["gpu_hour"]["device"] == "NVIDIA T4"
        and shown["gpu_hour"]["credited_flops_per_gpu_hour"] == 1.458e16
    )

    text = format_credits(report)
    assert f"aggregator {AGGREGATOR.fingerprint}, key {PEERS[1].fingerprint}" in text  # the names logs use
    assert (
        f"credits {reply['credits']:,} training FLOPs ({gpu_hours(reply['credits']):.3g} GPU-hours)" in text
    )
    assert "3 of 3 inclusion proofs check" in text and "1 GPU-hour = an hour of an NVIDIA T4" in text

    reply["entries"][0]["proof"][0] = "00" * 32  # a proof that does not lead to the signed root
    assert (
        check_credits(reply, AGGREGATOR.public_key_hex, "cifar10-ofa-test", tmp_path / "peer")["bad_proofs"]
        == 1
    )


def _credits(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HOME": str(tmp_path / "home"), "MANTA_LOG_LEVEL": "INFO"}
    return subprocess.run(
        [console_script("manta-peer"), "credits", "--identity", str(tmp_path / "id.key"), *args],
        capture_output=True, text=True, timeout=180, cwd=tmp_path, env=env,
    )  # fmt: skip


@pytest.mark.parametrize(
    "content, message",
    [
        ("{not json", "is unreadable"),
        ('{"initial_peers": [], "task_id": "t", "aggregator_key": "ab"}', "is not a swarm record"),
        (
            '{"initial_peers": ["x"], "task_id": "t", "aggregator_key": "ab"}',
            "aggregator_key must be a 64-digit",
        ),
    ],
)
def test_a_bad_swarm_json_is_one_line(tmp_path, content, message):
    Identity.load_or_create(tmp_path / "id.key")
    (tmp_path / "peer").mkdir()
    (tmp_path / "peer" / "swarm.json").write_text(content)
    done = _credits(tmp_path, "--data-dir", "peer")
    assert done.returncode == 1
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: peer/swarm.json") and message in lines[0], (
        done.stderr
    )


@pytest.mark.swarm  # starts a DHT node (and its p2p daemon) that finds nobody
def test_without_initial_peers_credits_asks_the_swarm_in_swarm_json(tmp_path):
    Identity.load_or_create(tmp_path / "id.key")
    with socket.socket() as s:  # a local port with nothing listening on it
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    peer = f"/ip4/127.0.0.1/tcp/{port}/p2p/QmSBUfPjhdbT5M2uQ6xHzpfukzPy4zLikVL22vxNhiqVzx"
    write_swarm_record(tmp_path / "peer", SwarmRecord((peer,), "digits", AGGREGATOR.public_key_hex))
    done = _credits(tmp_path, "--data-dir", "peer", "--json")
    assert done.returncode == 1 and "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("Error:")]
    assert errors == [f"Error: cannot reach the swarm: cannot reach any initial peer ({peer})"], done.stderr
