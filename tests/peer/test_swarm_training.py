"""Collaborative training across real local swarms: `manta-swarm`, model-parallel rounds, a peer
killed mid-run, and `manta-aggregator start --resume` (every process a real console script)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from testbed.local_swarm import LocalSwarm, SwarmOptions
from tests.helpers import console_script

pytestmark = pytest.mark.swarm

SMALL = dict(target_samples=96, batch_size=32, subnets=2, width_mult="0.25", head_channels=64)


def _env() -> dict:
    return dict(os.environ, MANTA_WORKER_THREADS="1", PYTHONUNBUFFERED="1")


def _processes_under(path: Path) -> list[psutil.Process]:
    """Live processes whose command line mentions ``path`` (a run's files): must be none afterwards."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if any(str(path) in part for part in proc.info["cmdline"] or []):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def _wait(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.5)


def _run_to_end(swarm: LocalSwarm) -> LocalSwarm:
    """Start the aggregator and every peer, wait until the peers have run all their rounds, stop all."""
    try:
        swarm.start_aggregator()
        for i in range(swarm.o.peers):
            swarm.start_peer(i)
        for i in range(swarm.o.peers):
            log = swarm.peer_dir(i) / "log.txt"
            assert swarm.procs[f"peer-{i}"].wait(timeout=600) == 0, log.read_text()[-3000:]
    finally:
        swarm.close()
    return swarm


def _committed(swarm: LocalSwarm, i: int) -> list[dict]:
    return [r for r in swarm.rounds(i) if r["committed"]]


def test_manta_swarm_trains_above_chance_with_identical_state_and_a_summary(tmp_path):
    run, summary_path = tmp_path / "run", tmp_path / "summary.json"
    done = subprocess.run(
        [
            console_script("manta-swarm"),
            "--peers",
            "2",
            "--rounds",
            "24",
            "--target-samples",
            "64",
            "--subnets",
            "2",
            "--width-mult",
            "0.25",
            "--data-dir",
            "run",  # relative, as `make demo`'s default folder is
            "--summary",
            str(summary_path),
        ],
        capture_output=True,
        text=True,
        timeout=900,
        env=_env(),
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Traceback" not in done.stdout + done.stderr
    assert re.search(r"round +24/24 ", done.stdout), done.stdout  # progress lines were shown
    summary = json.loads(summary_path.read_text())
    assert summary["rounds"] == 24
    assert summary["identical_final_state"] is True
    assert set(summary["samples_per_peer"]) == {"peer-0", "peer-1"}
    assert all(n > 0 for n in summary["samples_per_peer"].values())
    # Each round closes when the swarm's projected total reaches the target (64), whoever processed the
    # samples: at most half a mini-batch (16) per peer short of it, since every started batch is finished.
    assert summary["total_samples"] >= 24 * (64 - 2 * 16)
    assert summary["total_samples"] >= sum(summary["samples_per_peer"].values())
    for split in summary["time_split_s"].values():
        assert split["compute"] > 0 and split["averaging"] > 0
    # Ten digit classes: chance is 0.1. One round is one optimizer step; 24 steps are enough for a clear
    # margin (measured over 4 runs: smallest 0.70-0.79, largest 0.79-0.85). With 8 steps the smallest
    # sub-network ended anywhere in 0.25-0.46 (11 runs), too close to any fixed bar to test learning.
    assert summary["accuracy"]["largest"] > 0.5, summary["accuracy"]
    assert summary["accuracy"]["smallest"] > 0.5, summary["accuracy"]
    for i in range(2):
        assert (run / f"peer-{i}" / "identity.key").exists() and (run / f"peer-{i}" / "log.txt").exists()
    assert (run / "aggregator" / "task.sealed").exists()
    assert not _processes_under(run), "manta-swarm left processes behind"


def test_model_parallel_cohorts_train_different_subnetworks_into_one_model(tmp_path):
    swarm = _run_to_end(
        LocalSwarm(SwarmOptions(peers=2, cohorts=2, mode="model", rounds=4, run_dir=tmp_path, **SMALL))
    )
    a, b = ({r["round"]: r for r in _committed(swarm, i)} for i in range(2))
    together = sorted(set(a) & set(b))
    assert len(together) >= 3, (a.keys(), b.keys())
    for r in together:
        assert a[r]["state_digest"] == b[r]["state_digest"], f"peers differ after round {r}"
        assert a[r]["contributors"] == b[r]["contributors"] == 2
        assert a[r]["cohort"] != b[r]["cohort"]
        # Each cohort trained its own share of the round's sandwich list (largest / smallest).
        assert a[r]["subnets"] and b[r]["subnets"] and set(a[r]["subnets"]).isdisjoint(b[r]["subnets"])


def test_killing_one_peer_does_not_stop_the_run(tmp_path):
    swarm = LocalSwarm(SwarmOptions(peers=3, rounds=7, run_dir=tmp_path, **SMALL))
    try:
        swarm.start_aggregator()
        for i in range(3):
            swarm.start_peer(i)
        _wait(lambda: len(_committed(swarm, 2)) >= 2, 400, "two committed rounds")
        victim = psutil.Process(swarm.procs["peer-2"].pid)
        family = [victim, *victim.children(recursive=True)]
        os.kill(victim.pid, signal.SIGKILL)
        killed_after = max(r["round"] for r in _committed(swarm, 2))
        for i in range(2):
            assert swarm.procs[f"peer-{i}"].wait(timeout=600) == 0, (
                tmp_path / f"peer-{i}/log.txt"
            ).read_text()[-3000:]
        _wait(lambda: not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in family), 30,
              "the killed peer's workers and DHT to go")  # fmt: skip
    finally:
        swarm.close()
    survivors = [{r["round"]: r for r in _committed(swarm, i)} for i in range(2)]
    later = sorted(r for r in survivors[0] if r > killed_after + 1 and r in survivors[1])
    assert later, "the survivors committed no round after the kill"
    for r in later:
        assert survivors[0][r]["state_digest"] == survivors[1][r]["state_digest"]
        assert survivors[0][r]["contributors"] == 2
    assert len(survivors[0]) >= 7 - 1


def test_resume_continues_from_the_aggregators_newest_checkpoint(tmp_path):
    options = SwarmOptions(peers=2, rounds=4, run_dir=tmp_path, **SMALL)
    first = LocalSwarm(options)
    try:
        first.start_aggregator(checkpoint_every=2.0)
        for i in range(2):
            first.start_peer(i)
        for i in range(2):
            assert first.procs[f"peer-{i}"].wait(timeout=600) == 0
    finally:
        first.close()  # every volunteer has left and the aggregator is stopped
    checkpoints = sorted((tmp_path / "aggregator" / "checkpoints").glob("round-*.pt"))
    assert checkpoints, (tmp_path / "aggregator" / "log.txt").read_text()[-3000:]
    saved_round = int(checkpoints[-1].stem.split("-")[1])
    assert saved_round >= 1

    second = LocalSwarm(SwarmOptions(peers=1, rounds=2, run_dir=tmp_path, **SMALL))
    try:
        second.start_aggregator(resume=True)
        newcomer = second.start_peer(5)
        assert newcomer.wait(timeout=600) == 0, (tmp_path / "peer-5/log.txt").read_text()[-3000:]
    finally:
        second.close()
    log = (tmp_path / "peer-5" / "log.txt").read_text()
    assert f"loaded the swarm's state after round {saved_round}" in log, log[-3000:]
    rounds = [r["round"] for r in _committed(second, 5)]
    assert rounds[:2] == [saved_round + 1, saved_round + 2], rounds


@pytest.mark.slow  # a few minutes of swarm: `make test-all` runs it
def test_the_stereo_supernet_trains_through_the_same_swarm(tmp_path):
    # The stereo supernet is channels-last and regresses disparities; the swarm machinery is the same.
    options = SwarmOptions(
        peers=2, task="stereo-synthetic", rounds=2, target_samples=8, batch_size=4, subnets=2,
        learning_rate="0.005", run_dir=tmp_path,
    )  # fmt: skip
    swarm = _run_to_end(LocalSwarm(options))
    a, b = ({r["round"]: r for r in _committed(swarm, i)} for i in range(2))
    assert sorted(a) == sorted(b) == [0, 1], (a.keys(), b.keys())
    for r in a:
        assert a[r]["state_digest"] == b[r]["state_digest"] and a[r]["contributors"] == 2
        assert a[r]["loss"] > 0 and a[r]["loss"] == a[r]["loss"]  # finite, not NaN
