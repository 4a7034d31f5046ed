"""A swarm on an operator's image folder, as volunteers run it: `manta-aggregator start` packs a real
PNG folder into shards and prints the join line; three `manta-peer join` processes with that line
alone fetch the shard list and their shares from the swarm, train, and sign the shards they drew from
into their receipts, which the aggregator's spot audits replay. The dashboard's API shows the shards,
their holders and the bytes served."""

from __future__ import annotations

import sqlite3
import time

import pytest

from protocol.records import ContributionReceipt
from protocol.sealing import open_sealed, parse_sealed
from protocol.task_spec import TaskSpec
from tasks.shards.local import read_manifest
from testbed.image_folder import make_image_folder
from testbed.local_swarm import LocalSwarm, SwarmOptions
from tests.aggregator.monitor_helpers import free_port, get_json

# Slow (about a minute; `make test-all`): the default suite serves and fetches shards between real
# nodes (tests/peer/test_data_feed.py) and runs the whole swarm on built-in data (test_swarm_training.py).
pytestmark = [pytest.mark.swarm, pytest.mark.slow]

PEERS = 3


def test_volunteers_train_on_shards_served_by_the_swarm(tmp_path):
    images = make_image_folder(tmp_path / "images", 1200, size=16)
    options = SwarmOptions(
        peers=PEERS, task="imagefolder", rounds=2, run_dir=tmp_path / "run", target_samples=96, batch_size=16, subnets=2,
        width_mult="0.25", head_channels=32, data_path=str(images), shard_samples=60,
    )  # fmt: skip
    swarm = LocalSwarm(options)
    port = free_port()
    statuses = []
    try:
        swarm.start_aggregator(extra_args=("--audit-fraction", "1.0", "--http", f"127.0.0.1:{port}"))
        for i in range(PEERS):
            swarm.start_peer(i)
        deadline = time.monotonic() + 300
        while swarm.peers_running():
            assert time.monotonic() < deadline, "the swarm did not finish its rounds in time"
            statuses.append(get_json(f"http://127.0.0.1:{port}/api/status"))
            time.sleep(1.0)
        for i in range(PEERS):
            log = (swarm.peer_dir(i) / "log.txt").read_text()
            assert swarm.procs[f"peer-{i}"].wait(timeout=60) == 0, log[-3000:]
        final = get_json(f"http://127.0.0.1:{port}/api/status")
    finally:
        swarm.close()  # the aggregator appends what is queued and finishes its audits first

    aggregator = swarm.dir / "aggregator"
    spec = open_sealed((aggregator / "task.sealed").read_bytes(), TaskSpec).record
    assert spec.data is not None and spec.data.kind == "imagefolder"
    packed = {p.name for p in (aggregator / "data" / "shards").glob("*.shard")}
    assert len(packed) == spec.data.shards

    # Each peer downloaded its share (this epoch's and the next's), never every shard.
    held = {
        i: {p.name for p in (swarm.peer_dir(i) / "data" / "shards").glob("*.shard")} for i in range(PEERS)
    }
    for i, names in held.items():
        assert names and names < packed, f"peer-{i} holds {len(names)} of {len(packed)} shards"

    # Every receipt names the training shards its streams drew from; all were appended, the audits
    # replayed them from those shards and passed.
    with sqlite3.connect(aggregator / "ledger.sqlite") as db:
        wires = [row[0] for row in db.execute("SELECT data FROM entries")]
    receipts = [parse_sealed(w, ContributionReceipt).record for w in wires if w.startswith(b"manta/receipt/")]
    assert len(receipts) >= PEERS * options.rounds - 1
    manifest = read_manifest(aggregator / "data", spec.data)
    train = {e.index for e in manifest.split("train")}
    assert all(r.data_shards and set(r.data_shards) <= train for r in receipts)
    revocations = [w for w in wires if w.startswith(b"manta/revocation/")]
    log = (aggregator / "log.txt").read_text()
    assert "audit passed" in log and "audit FAILED" not in log and revocations == []

    # The dashboard saw the shards on the peers and the bytes the aggregator served them.
    data = final["data"]
    assert data["shards"] == spec.data.shards and data["root"] == spec.data.root
    assert data["held_by_peers"] >= 1 and data["aggregator_bytes_served"] > 0
    assert any(s["data"] and s["data"]["held_by_peers"] for s in statuses)
    bitmaps_seen = [p for p in data["peers"] if p["shards"]]
    assert bitmaps_seen and all(p["fetched"] > 0 for p in bitmaps_seen)
