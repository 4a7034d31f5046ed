"""Receipts, checks, spot audits and credits in a real local swarm with four dishonest peers.

One honest peer and four that each cheat in one way (tests/adversaries/dishonest_peer.py): a
forged signature, a replayed receipt, an inflated sample count, a fabricated gradient. Every process
is a real console script on 127.0.0.1; the ledger is the aggregator's real SQLite file.
"""

from __future__ import annotations

import json
import re
import signal
import sqlite3
import subprocess
import time

import pytest

from ledger.rewards import compute_rewards
from ledger.store import LedgerStore
from ledger.units import gpu_hours
from protocol.identity import Identity
from protocol.records import ContributionReceipt, Revocation
from protocol.sealing import parse_sealed
from testbed.local_swarm import LocalSwarm, SwarmOptions
from tests.adversaries import dishonest_peer
from tests.helpers import console_script
from tests.ledger.helpers import tamper

# Slow (about 2 minutes; `make test-all`): the default suite runs each cheat against the real
# aggregator's parts: forged signatures and replays (tests/aggregator/test_intake.py), inflated counts
# (test_contribution_checks.py), fabricated gradients (test_audits.py), the credits report
# (tests/peer/test_credits.py) and the ledger's verification (tests/ledger/).
pytestmark = [pytest.mark.swarm, pytest.mark.slow]

FAULTS = {1: "forge", 2: "replay", 3: "inflate", 4: "fabricate"}


def _key(swarm: LocalSwarm, i: int) -> str:
    return Identity.load(swarm.peer_dir(i) / "identity.key").public_key_hex


@pytest.fixture(scope="module")
def cheated_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("cheaters")
    options = SwarmOptions(
        peers=5, rounds=4, run_dir=run, target_samples=128, batch_size=32, subnets=2, width_mult="0.25",
        head_channels=64,
    )  # fmt: skip
    swarm = LocalSwarm(options)
    credits_out = None
    try:
        # The dashboard stays on: its checkpoint evaluations run beside the audits in the aggregator
        # and must not disturb the random draws an audit replays (honest peers get no revocation).
        swarm.start_aggregator(extra_args=("--audit-fraction", "1.0", "--http", "127.0.0.1:0"))
        for i in range(5):
            swarm.start_peer(i, command=dishonest_peer.command(FAULTS[i]) if i in FAULTS else None)
        for i in range(5):
            assert swarm.procs[f"peer-{i}"].wait(timeout=900) == 0, (run / f"peer-{i}/log.txt").read_text()[
                -3000:
            ]
        # While the aggregator still runs: the honest peer asks for its credits and checks its proofs.
        initial = [a for a in swarm.join_args if a.startswith("/ip4/")]
        credits_out = subprocess.run(
            [
                console_script("manta-peer"),
                "credits",
                "--initial-peers",
                *initial,
                "--identity",
                str(swarm.peer_dir(0) / "identity.key"),
                "--data-dir",
                str(swarm.peer_dir(0)),
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        # The same, machine-readable, finding the swarm in the data directory (join wrote swarm.json).
        credits_json = subprocess.run(
            [console_script("manta-peer"), "credits", "--json", "--identity",
             str(swarm.peer_dir(0) / "identity.key"), "--data-dir", str(swarm.peer_dir(0))],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
    finally:
        swarm.close()  # the aggregator appends what is queued and finishes the chosen audits first
    return swarm, (credits_out, credits_json)


def _ledger(swarm):
    with LedgerStore.open(swarm.dir / "aggregator" / "ledger.sqlite", readonly=True) as store:
        entries = [data for _, data in store.entries()]
        key = store.log_public_key
    return entries, key


def test_each_dishonest_peer_is_refused_or_revoked_with_the_right_reason(cheated_run):
    swarm, _ = cheated_run
    log = (swarm.dir / "aggregator" / "log.txt").read_text()
    entries, _ = _ledger(swarm)
    receipts = {}
    revocations = []
    for index, data in enumerate(entries):
        sealed = parse_sealed(data, (ContributionReceipt, Revocation))
        if isinstance(sealed.record, Revocation):
            revocations.append(sealed.record)
        else:
            receipts[index] = sealed
    by_key = {}
    for index, sealed in receipts.items():
        by_key.setdefault(sealed.public_key.hex(), []).append(index)
    # forge: refused at intake for its signature, never in the ledger.
    assert "receipt refused: bad_signature" in log
    assert _key(swarm, 1) not in by_key
    # replay: the old receipt's bytes are refused as a replay; the ledger holds each receipt once.
    assert "receipt refused: replay" in log
    assert len(set(entries)) == len(entries)
    # inflate: ten times the samples its averaging group saw, in a group of its own that no other
    # peer committed (the real group's root does not count them): every one of its receipts is
    # refused for that (or, once its rate is measured, as beyond it), as the peer itself was told.
    told = [
        json.loads(p.read_text())["reason"]
        for p in (swarm.peer_dir(3) / "receipts" / "rejected").glob("*.json")
    ]
    assert told and set(told) <= {"unwitnessed", "implausible_samples"}, told
    assert _key(swarm, 3) not in by_key
    # fabricate: accepted (it looks fine), then a spot audit (every receipt of a new key is audited)
    # revokes all of its credit and excludes the key: its later receipts are refused.
    fabricated = by_key.get(_key(swarm, 4), [])
    assert fabricated, "the fabricator's receipts never reached the ledger"
    revoked = {r.entry_index for r in revocations}
    assert revoked and revoked <= set(fabricated), (revoked, fabricated)
    assert all(r.reason.startswith("audit_failed") for r in revocations)
    assert set(fabricated) <= revoked, "a fabricated receipt kept its credit"
    assert re.search(rf"key {_key(swarm, 4)[:16]} excluded", log)


def test_honest_credits_are_intact_and_the_peer_checks_its_proofs(cheated_run):
    swarm, (credits_out, credits_json) = cheated_run
    entries, key = _ledger(swarm)
    rewards = {p.public_key: p for p in compute_rewards(entries, key).peers}
    honest = rewards[_key(swarm, 0)]
    written = len(list((swarm.peer_dir(0) / "receipts").glob("*/*.receipt")))
    refusals = [p.read_text() for p in (swarm.peer_dir(0) / "receipts" / "rejected").glob("*.json")]
    assert not refusals, refusals
    assert honest.revoked == 0 and honest.entries == written > 0
    assert honest.credits > 0
    fabricator = rewards.get(_key(swarm, 4))
    assert fabricator is None or fabricator.revoked > 0
    assert "audit passed" in (swarm.dir / "aggregator" / "log.txt").read_text()
    # `manta-peer credits` printed the honest peer's credits and checked every proof.
    assert credits_out.returncode == 0, credits_out.stdout + credits_out.stderr
    m = re.search(r"(\d+) of (\d+) inclusion proofs check against the checkpoint", credits_out.stdout)
    assert m and m.group(1) == m.group(2) and int(m.group(1)) > 0, credits_out.stdout
    m = re.search(r"credits ([\d,]+) training FLOPs \(([\d.e+-]+) GPU-hours\)", credits_out.stdout)
    assert m and float(m.group(2)) == pytest.approx(gpu_hours(int(m.group(1).replace(",", ""))), rel=1e-2)
    # `--json` without --initial-peers: every figure in both units, from the swarm in swarm.json.
    record = json.loads((swarm.peer_dir(0) / "swarm.json").read_text())
    line = swarm.join_args
    assert record == {
        "initial_peers": [a for a in line if a.startswith("/ip4/")],
        "task_id": line[line.index("--task") + 1],
        "aggregator_key": line[line.index("--aggregator-key") + 1],
    }
    assert credits_json.returncode == 0, credits_json.stdout + credits_json.stderr
    shown = json.loads(credits_json.stdout)
    assert (
        shown["task_id"] == record["task_id"]
        and shown["aggregator"]["public_key"] == record["aggregator_key"]
    )
    assert (
        shown["credits"]["flops"] == sum(e["credit_flops"] for e in shown["entries"] if not e["revoked"]) > 0
    )
    assert shown["credits"]["gpu_hours"] == gpu_hours(shown["credits"]["flops"])
    assert shown["bad_proofs"] == 0 and shown["proofs_ok"] == len(shown["entries"]) > 0


def test_the_live_ledger_verifies_and_an_altered_entry_is_named(cheated_run):
    swarm, _ = cheated_run
    path = swarm.dir / "aggregator" / "ledger.sqlite"
    ok = subprocess.run([console_script("manta-ledger"), "verify", str(path)], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    rewards = subprocess.run(
        [console_script("manta-ledger"), "rewards", str(path)], capture_output=True, text=True
    )
    honest = Identity.load(swarm.peer_dir(0) / "identity.key").fingerprint
    assert rewards.returncode == 0 and honest in rewards.stdout, rewards.stdout
    conn = sqlite3.connect(path)
    (data,) = conn.execute("SELECT data FROM entries WHERE idx = 0").fetchone()
    conn.close()
    tamper(
        path,
        "UPDATE entries SET data = ? WHERE idx = 0",
        params=(re.sub(rb'"samples":(\d)', rb'"samples":9\1', data, count=1),),
    )
    bad = subprocess.run(
        [console_script("manta-ledger"), "verify", str(path)], capture_output=True, text=True
    )
    assert bad.returncode == 1 and "entry 0 " in bad.stdout, bad.stdout


def test_unproven_receipts_survive_a_peer_restart_and_an_aggregator_outage(tmp_path):
    # Two peers: a receipt whose group lists its sender alone is refused (no other member witnesses
    # it), so a lone peer's receipts were all refused and none was left unproven to survive.
    options = SwarmOptions(peers=2, rounds=10_000, run_dir=tmp_path, target_samples=64, subnets=2,
                           width_mult="0.25", head_channels=64)  # fmt: skip
    first = LocalSwarm(options)
    checkpoints = tmp_path / "aggregator" / "checkpoints"
    try:
        first.start_aggregator(checkpoint_every=1.0, extra_args=("--http", "off"))
        peers = [first.start_peer(i) for i in range(2)]
        # The peers train until the aggregator holds a checkpoint to resume from (it downloads the
        # state every 2 s), then leave (Ctrl-C: after their round).
        deadline = time.monotonic() + 600
        while not list(checkpoints.glob("round-*.pt")):
            assert all(p.poll() is None for p in peers), "a peer ended before any checkpoint"
            assert time.monotonic() < deadline, "no checkpoint while the peers trained"
            time.sleep(0.5)
        for peer in peers:
            peer.send_signal(signal.SIGINT)
        assert [peer.wait(timeout=300) for peer in peers] == [0, 0]
    finally:
        first.close()  # the aggregator goes down right after the peer left
    outbox = tmp_path / "peer-0" / "receipts"
    unproven = {p.name for p in (outbox / "pending").glob("*.receipt")}
    assert unproven, "every receipt was already proven: nothing left to survive the outage"

    second = LocalSwarm(SwarmOptions(**{**options.__dict__, "rounds": 1}))
    try:
        second.start_aggregator(resume=True, extra_args=("--http", "off"))
        assert second.start_peer(0).wait(timeout=600) == 0  # the same peer, restarted with its data dir
    finally:
        second.close()
    settled = {p.name for p in (outbox / "settled").glob("*.receipt")}
    assert unproven <= settled, (unproven, settled)  # delivered after the restart, proven included
    with LedgerStore.open(tmp_path / "aggregator" / "ledger.sqlite", readonly=True) as store:
        assert store.size >= len(settled)
