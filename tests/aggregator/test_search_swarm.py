"""``manta-aggregator search`` against a real local swarm: the peers evaluate shares of every
generation, and the result is exactly that of a purely local search on the same checkpoint.

Every process is a real console script on 127.0.0.1 (one ``manta-aggregator start``, two
``manta-peer join`` that keep training while they evaluate, one ``manta-aggregator search``). In one
test a peer lies (tests/adversaries/dishonest_peer.py, ``search-lie``): the search's spot checks catch it and the result is
still the local one.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from protocol.identity import Identity
from supernet.checkpoint import save_trained
from supernet.search.run import SearchOptions, SearchReport, run_search
from supernet.training.loop import train
from supernet.workload import workload_for
from testbed.local_swarm import LocalSwarm, SwarmOptions
from tests.adversaries import dishonest_peer
from tests.helpers import console_script
from tests.supernet.threads import single_torch_thread  # noqa: F401

pytestmark = pytest.mark.swarm

SMALL = dict(target_samples=96, batch_size=32, subnets=2, width_mult="0.25", head_channels=64)
SEARCH = dict(max_mflops=1000.0, evaluations=8, population=4, val_samples=48, bn_batches=1, latency_repeats=1)


def _start(tmp_path: Path, commands: dict[int, list[str]] | None = None) -> LocalSwarm:
    swarm = LocalSwarm(SwarmOptions(peers=2, rounds=10_000, run_dir=tmp_path / "run", **SMALL))
    swarm.start_aggregator(checkpoint_every=2.0)
    for i in range(2):
        swarm.start_peer(i, command=(commands or {}).get(i))
    return swarm


def _wait_for(swarm: LocalSwarm, ready, what: str, timeout: float = 180.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = ready()
        if found:
            return found
        for name, proc in swarm.procs.items():
            assert proc.poll() is None, f"{name} exited: {(swarm.dir / name / 'log.txt').read_text()[-2000:]}"
        time.sleep(0.5)
    raise AssertionError(f"no {what} within {timeout:.0f} s")


def _search(
    swarm: LocalSwarm,
    checkpoint: Path,
    tmp_path: Path,
    *extra: str,
    stderr=subprocess.PIPE,
    latency: Path | None = None,
):
    agg = swarm.dir / "aggregator"
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in SEARCH.items()]
    # No --initial-peers: the search finds the swarm through the aggregator's multiaddrs.txt.
    args = [
        console_script("manta-aggregator"), "search", "--data-dir", str(agg), "--identity",
        str(agg / "identity.key"), "--checkpoint", str(checkpoint),
        "--latency-table", str(latency or tmp_path / "latency.json"), "--json", str(tmp_path / "distributed.json"),
        *flags, *extra,
    ]  # fmt: skip
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=stderr, text=True)


def _trained_checkpoint(tmp_path: Path) -> Path:
    """Any digits checkpoint will do (a peer rebuilds the supernet the checkpoint describes)."""
    workload = workload_for("digits", dict(width_mult=0.25, head_channels=64, channel_divisor=4, total_steps=4,
                                           batch_size=32, bn_calibration_batches=1, eval_random_subnets=0,
                                           log_every=0))  # fmt: skip
    trained = train(workload.cfg, workload.task, progress=lambda line: None)
    return save_trained(tmp_path / "digits.pt", workload, trained["net"], round_index=3)


@dataclass(frozen=True)
class LocalBaseline:
    """A trained checkpoint and the search of it in this process alone: what a distributed search of
    the same checkpoint must equal, value for value."""

    checkpoint: Path
    latency: Path  # the latency table both searches use
    report: SearchReport
    evaluated: dict


@pytest.fixture(scope="module")
def baseline(tmp_path_factory) -> LocalBaseline:
    """Built once for the module, on a quiet machine (before any swarm of these tests starts)."""
    folder = tmp_path_factory.mktemp("baseline")
    checkpoint = _trained_checkpoint(folder)
    report, evaluated = _local(checkpoint, folder)
    return LocalBaseline(checkpoint, folder / "latency.json", report, evaluated)


def _joined(swarm: LocalSwarm) -> bool:
    """Peers serve evaluations from before they announce themselves: a search can start once both joined."""
    return all("joined task" in (swarm.peer_dir(i) / "log.txt").read_text() for i in range(2))


def _local(checkpoint: Path, tmp_path: Path):
    """The same search in this process alone, without any helper."""
    options = SearchOptions(checkpoint, latency_table=tmp_path / "latency.json", **SEARCH)
    report = run_search(options, say=lambda _line: None)
    return report, {c.hash: c.metric for s in report.searches for c in s.candidates}


def _calls(initial: list[str], peer_id: str, task_id: str, payloads: list[bytes]) -> list[dict]:
    """Raw ``manta/<task>/evaluate`` calls from a fresh client node."""
    from hivemind_adapter.dht import start_dht
    from hivemind_adapter.p2p import Endpoint
    from protocol.evaluation_requests import evaluate_handler

    dht = start_dht(initial_peers=initial, client_mode=True)
    endpoint = Endpoint(dht, "test-client")
    try:
        return [
            json.loads(endpoint.call(peer_id, evaluate_handler(task_id), p, timeout=60)) for p in payloads
        ]
    finally:
        endpoint.close()
        dht.shutdown()


# Slow (make test-all): the lying-peer test below also spreads a search over live peers and
# compares it with local search; this one adds only the even spread.
@pytest.mark.slow
def test_search_spreads_over_live_peers_and_equals_local_search(tmp_path, baseline):
    from protocol.evaluation_requests import sign_request

    t0 = time.monotonic()
    checkpoint, report, local = baseline.checkpoint, baseline.report, baseline.evaluated
    swarm = _start(tmp_path)
    try:
        _wait_for(swarm, lambda: _joined(swarm), "peers joined")
        print(f"peers joined at {time.monotonic() - t0:.1f} s")
        search = _search(
            swarm,
            checkpoint,
            tmp_path,
            "--peers-wait",
            "60",
            "--peer-timeout",
            "120",
            latency=baseline.latency,
        )
        stdout, stderr = search.communicate(timeout=300)
        print(f"search done at {time.monotonic() - t0:.1f} s\n{stderr}")
        assert search.returncode == 0, stderr[-3000:]
        result = json.loads((tmp_path / "distributed.json").read_text())
        peers = result["distributed"]["peers"]
        assert len(peers) == 2, stderr[-3000:]
        assert all(p["configs"] > 0 and p["redone_locally"] == 0 for p in peers), peers
        # Spot checks are on by default: honest values pass them exactly, across the wire.
        assert all(p["verified"] >= 1 and p["mismatches"] == 0 and not p["untrusted"] for p in peers), peers
        assert (
            sum(p["configs"] for p in peers)
            == len(result["distributed"]["evaluated"])
            == SEARCH["evaluations"]
        )
        assert "generation 0: " in stderr and "2 peer(s) online" in stderr
        assert all(f"peer {p['peer_id']}: {p['configs']} sub-network(s) evaluated" in stdout for p in peers)

        # Requests the peers must refuse: a key that is not the aggregator's, and the aggregator's
        # signature on a request naming another requester (a replay from another node).
        task_id = swarm.join_args[swarm.join_args.index("--task") + 1]
        initial = [a for a in swarm.join_args if a.startswith("/ip4/")]
        target = peers[0]["peer_id"]
        body = dict(task_id=task_id, peer=target, checkpoint={"sha256": "0" * 64, "size": 1, "digest": "x"},
                    evaluator={}, share={})  # fmt: skip
        aggregator = Identity.load(swarm.dir / "aggregator" / "identity.key")
        stranger, replayed = _calls(initial, target, task_id, [
            sign_request(Identity.generate(), requester="QmSomeone", **body),
            sign_request(aggregator, requester=target, **body),
        ])  # fmt: skip
        assert stranger["status"] == "refused" and "not signed by an aggregator" in stranger["detail"], (
            stranger
        )
        assert replayed["status"] == "refused" and "another requester" in replayed["detail"], replayed
        print(f"refusals checked at {time.monotonic() - t0:.1f} s")
    finally:
        swarm.stop(swarm.peer_names(), grace=2.0)  # their clean exit is tested elsewhere
        swarm.close()
    print(f"swarm stopped at {time.monotonic() - t0:.1f} s")

    # The same values for every evaluated sub-network, the same choice, whoever computed them.
    assert local == result["distributed"]["evaluated"]
    assert result["chosen"]["hash"] == report.chosen.hash
    assert result["chosen"]["metric"] == report.final["metric"]


# Slow (make test-all; 66 s): the default suite catches a lying helper in one process with the same
# spot checks (tests/supernet/test_search.py::test_a_lying_helper_is_caught_its_shares_redone_...).
@pytest.mark.slow
def test_a_lying_peer_is_caught_by_spot_checks_and_the_result_equals_local_search(tmp_path, baseline):
    t0 = time.monotonic()
    checkpoint, report, local = baseline.checkpoint, baseline.report, baseline.evaluated
    swarm = _start(tmp_path, commands={1: dishonest_peer.command("search-lie")})
    try:
        _wait_for(swarm, lambda: _joined(swarm), "peers joined")
        joined = re.search(r"peer (\S{8}) \([^)]*\) joined task", (swarm.peer_dir(1) / "log.txt").read_text())
        liar = joined.group(1)  # the last 8 characters of the lying peer's id
        search = _search(swarm, checkpoint, tmp_path, "--peers-wait", "60", "--peer-timeout", "120",
                         "--verify-fraction", "0.1", latency=baseline.latency)  # fmt: skip
        stdout, stderr = search.communicate(timeout=300)
        print(f"search done at {time.monotonic() - t0:.1f} s\n{stderr}")
        assert search.returncode == 0, stderr[-3000:]
    finally:
        swarm.stop(swarm.peer_names(), grace=2.0)
        swarm.close()
    result = json.loads((tmp_path / "distributed.json").read_text())
    peers = {p["peer_id"][-8:]: p for p in result["distributed"]["peers"]}
    assert len(peers) == 2 and liar in peers, (liar, peers)
    lying, honest = peers.pop(liar), next(iter(peers.values()))
    # Caught on its first share (every value it returns is wrong), which is discarded and redone here.
    assert lying["untrusted"] and lying["mismatches"] == lying["verified"] >= 1, lying
    assert lying["discarded"] == lying["configs"] > 0, lying
    assert not honest["untrusted"] and honest["mismatches"] == 0 and honest["verified"] >= 1, honest
    assert "UNTRUSTED" in stderr and "untrusted" in stdout
    assert local == result["distributed"]["evaluated"]
    assert result["chosen"]["hash"] == report.chosen.hash
    assert result["chosen"]["metric"] == report.final["metric"]


@pytest.mark.slow
def test_a_peer_killed_during_the_search_has_its_shares_redone_with_the_same_result(tmp_path):
    """On the swarm's own checkpoint: one peer is killed after the search counted it online."""
    swarm = _start(tmp_path)
    try:
        folder = swarm.dir / "aggregator" / "checkpoints"
        found = _wait_for(swarm, lambda: sorted(folder.glob("round-*.pt")), "checkpoint")
        time.sleep(0.5)
        checkpoint = Path(shutil.copyfile(found[-1], tmp_path / found[-1].name))  # old ones get deleted
        log = tmp_path / "search.log"
        with open(log, "w") as err:
            search = _search(
                swarm, checkpoint, tmp_path, "--peers-wait", "60", "--peer-timeout", "30", stderr=err
            )
            _wait_for(swarm, lambda: "2 peer(s) online" in log.read_text(), "peers online line", 120)
            victim = swarm.procs["peer-1"]
            victim.kill()  # its DHT node and p2pd die with it (orphan reaper)
            victim.wait(30)
            stdout, _ = search.communicate(timeout=300)
        assert search.returncode == 0, log.read_text()[-3000:]
        result = json.loads((tmp_path / "distributed.json").read_text())
    finally:
        swarm.close()
    dead = json.loads((swarm.peer_dir(1) / "rounds.jsonl").read_text().splitlines()[0])["peer_id"]
    shares = {p["peer_id"]: p for p in result["distributed"]["peers"]}
    assert shares[dead]["configs"] == 0 and shares[dead]["redone_locally"] > 0, (shares, log.read_text())
    assert all(p["configs"] > 0 for k, p in shares.items() if k != dead), shares
    assert "redone locally" in log.read_text()
    report, local = _local(checkpoint, tmp_path)
    assert local == result["distributed"]["evaluated"]
    assert result["chosen"]["hash"] == report.chosen.hash
