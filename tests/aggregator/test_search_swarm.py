"""``manta-aggregator search`` against a real local swarm: the peers evaluate shares of every
generation, and the result is exactly that of a purely local search on the same checkpoint.

Every process is a real console script on 127.0.0.1 (one ``manta-aggregator start``, two
``manta-peer join`` that keep training while they evaluate, one ``manta-aggregator search``).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from peer.local_swarm import LocalSwarm, SwarmOptions
from protocol.identity import Identity
from supernet.search.run import SearchOptions, run_search
from tests.helpers import console_script
from tests.supernet.threads import single_torch_thread  # noqa: F401

pytestmark = pytest.mark.swarm

SMALL = dict(target_samples=96, batch_size=32, subnets=2, width_mult="0.25", head_channels=64)
SEARCH = dict(max_mflops=1000.0, evaluations=8, population=4, val_samples=48, bn_batches=1, latency_repeats=2)


def _start(tmp_path: Path) -> LocalSwarm:
    swarm = LocalSwarm(SwarmOptions(peers=2, rounds=10_000, run_dir=tmp_path / "run", **SMALL))
    swarm.start_aggregator(checkpoint_every=2.0)
    for i in range(2):
        swarm.start_peer(i)
    return swarm


def _first_checkpoint(swarm: LocalSwarm, into: Path, timeout: float = 180.0) -> Path:
    """A copy of the aggregator's first checkpoint (the aggregator deletes old ones as it goes)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = sorted((swarm.dir / "aggregator" / "checkpoints").glob("round-*.pt"))
        if found:
            time.sleep(0.5)  # written atomically; a moment for the name to be final
            return Path(shutil.copyfile(found[-1], into / found[-1].name))
        for name, proc in swarm.procs.items():
            assert proc.poll() is None, f"{name} exited: {(swarm.dir / name / 'log.txt').read_text()[-2000:]}"
        time.sleep(0.5)
    raise AssertionError("the aggregator wrote no checkpoint in time")


def _search_args(swarm: LocalSwarm, checkpoint: Path, table: Path, out: Path) -> list[str]:
    agg = swarm.dir / "aggregator"
    initial = [a for a in swarm.join_args if a.startswith("/ip4/")]
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in SEARCH.items()]
    return [
        console_script("manta-aggregator"), "search", "--data-dir", str(agg), "--identity",
        str(agg / "identity.key"), "--checkpoint", str(checkpoint), "--initial-peers", *initial,
        "--peers-wait", "60", "--latency-table", str(table), "--json", str(out), *flags,
    ]  # fmt: skip


def _local(checkpoint: Path, table: Path) -> dict[str, float]:
    report = run_search(SearchOptions(checkpoint, latency_table=table, **SEARCH), say=lambda _line: None)
    return report, {c.hash: c.metric for s in report.searches for c in s.candidates}


def _call(initial: list[str], peer_id: str, task_id: str, payload: bytes) -> dict:
    """One raw ``manta/<task>/evaluate`` call from a fresh client node."""
    import hivemind
    from google.protobuf.wrappers_pb2 import BytesValue
    from hivemind.p2p import PeerID

    from protocol.aio import BackgroundLoop
    from protocol.evaluation_requests import evaluate_handler

    dht = hivemind.DHT(initial_peers=initial, client_mode=True, start=True)
    loop = BackgroundLoop()
    try:
        p2p = loop.run(dht.replicate_p2p(), timeout=30)
        reply = loop.run(
            p2p.call_protobuf_handler(
                PeerID.from_base58(peer_id), evaluate_handler(task_id), BytesValue(value=payload), BytesValue
            ),
            timeout=60,
        )
        return json.loads(reply.value) | {"caller": dht.peer_id.to_base58()}
    finally:
        loop.stop()
        dht.shutdown()


def test_search_spreads_over_live_peers_and_equals_local_search(tmp_path, single_torch_thread):  # noqa: F811
    from protocol.evaluation_requests import sign_request

    swarm = _start(tmp_path)
    try:
        checkpoint = _first_checkpoint(swarm, tmp_path)
        out, table = tmp_path / "distributed.json", tmp_path / "latency.json"
        started = time.monotonic()
        done = subprocess.run(
            _search_args(swarm, checkpoint, table, out), capture_output=True, text=True, timeout=300
        )
        seconds = time.monotonic() - started
        assert done.returncode == 0, done.stderr[-3000:]
        result = json.loads(out.read_text())
        peers = result["distributed"]["peers"]
        print(
            f"distributed search: {seconds:.1f} s; shares {[(p['peer_id'][-8:], p['configs']) for p in peers]}"
        )
        assert len(peers) == 2, done.stderr[-3000:]
        assert all(p["configs"] > 0 and p["redone_locally"] == 0 for p in peers), peers
        assert sum(p["configs"] for p in peers) == len(result["distributed"]["evaluated"])
        assert "generation 0: " in done.stderr and "peer(s) online" in done.stderr

        # Requests the peers must refuse: a key that is not the aggregator's, and the aggregator's
        # signature on a request naming another requester (a replay from another node).
        task_id = swarm.join_args[swarm.join_args.index("--task") + 1]
        initial = [a for a in swarm.join_args if a.startswith("/ip4/")]
        target = peers[0]["peer_id"]
        body = dict(task_id=task_id, peer=target, checkpoint={"sha256": "0" * 64, "size": 1, "digest": "x"},
                    evaluator={}, share={})  # fmt: skip
        stranger = _call(initial, target, task_id, sign_request(Identity.generate(), requester="x", **body))
        assert stranger["status"] == "refused" and "not signed by an aggregator" in stranger["detail"], (
            stranger
        )
        aggregator = Identity.load(swarm.dir / "aggregator" / "identity.key")
        replayed = _call(initial, target, task_id, sign_request(aggregator, requester=target, **body))
        assert replayed["status"] == "refused" and "another requester" in replayed["detail"], replayed
    finally:
        swarm.close()

    # The same search on this process alone: every evaluated value and the choice are identical.
    report, local = _local(checkpoint, table)
    assert local == result["distributed"]["evaluated"]
    assert result["chosen"]["hash"] == report.chosen.hash
    assert result["chosen"]["metric"] == report.final["metric"]
