"""Collaborative training across real local swarms: `manta-swarm`, model-parallel rounds, partial
participation (a silent peer, a joiner, a peer killed mid-run), and `manta-aggregator start --resume`
(every process a real console script)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path

import psutil
import pytest

from testbed.local_swarm import LocalSwarm, SwarmOptions
from tests.adversaries import dishonest_peer
from tests.helpers import console_script, processes_mentioning, run_swarm_to_end, wait_until

pytestmark = pytest.mark.swarm

SMALL = dict(target_samples=96, batch_size=32, subnets=2, width_mult="0.25", head_channels=64)


def _env() -> dict:
    return dict(os.environ, MANTA_WORKER_THREADS="1", PYTHONUNBUFFERED="1")


def _committed(swarm: LocalSwarm, i: int) -> list[dict]:
    return [r for r in swarm.rounds(i) if r["committed"]]


@pytest.fixture(scope="module")
def manta_swarm_run(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """One ``manta-swarm`` run as `make demo` starts it, shared by the tests that read its results
    (the summary, and the aggregator's checkpoints a resumed run continues from)."""
    where = tmp_path_factory.mktemp("manta-swarm")
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
            str(where / "summary.json"),
        ],
        capture_output=True,
        text=True,
        timeout=900,
        env=_env(),
        cwd=where,
    )
    return where, done


def test_manta_swarm_trains_above_chance_with_identical_state_and_a_summary(manta_swarm_run):
    where, done = manta_swarm_run
    run, summary_path = where / "run", where / "summary.json"
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
    # every round's report counts the coordination its peer sent; the summary is their mean per round
    reports = [json.loads(line) for i in range(2) for line in (run / f"peer-{i}" / "rounds.jsonl").open()]
    assert all(r["control_messages"] > 0 and r["control_bytes"] > 0 for r in reports), reports
    mean = sum(r["control_bytes"] for r in reports) / len(reports)
    assert summary["swarm"]["control_bytes_per_peer_round"] == round(mean)
    # Once the cohort met whole, it meets as a known group, without matchmaking; a round falls back
    # to matchmaking when the board did not yet show the partner's report of the round before.
    for i in range(2):
        known = [r["known_group"] for r in reports if r["peer_id"] == reports[24 * i]["peer_id"]]
        assert not known[0] and sum(known) >= 18, known
    # Ten digit classes: chance is 0.1. One round is one optimizer step; 24 steps are enough for a clear
    # margin (measured over 4 runs: smallest 0.70-0.79, largest 0.79-0.85). With 8 steps the smallest
    # sub-network ended anywhere in 0.25-0.46 (11 runs), too close to any fixed bar to test learning.
    assert summary["accuracy"]["largest"] > 0.5, summary["accuracy"]
    assert summary["accuracy"]["smallest"] > 0.5, summary["accuracy"]
    for i in range(2):
        assert (run / f"peer-{i}" / "identity.key").exists() and (run / f"peer-{i}" / "log.txt").exists()
    assert (run / "aggregator" / "task.sealed").exists()
    assert not processes_mentioning(run), "manta-swarm left processes behind"


def test_the_stopped_aggregator_holds_the_last_committed_round_and_the_round_history(manta_swarm_run):
    """The aggregator, stopped after its volunteers left, wrote a last checkpoint as it stopped: its
    newest is the swarm's last committed round. Its rounds.jsonl has every committed round with the
    samples and contributors the peers counted."""
    where, done = manta_swarm_run
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    aggregator = where / "run" / "aggregator"
    log = (aggregator / "log.txt").read_text()
    committed = {}
    for i in range(2):
        for line in (where / "run" / f"peer-{i}" / "rounds.jsonl").read_text().splitlines():
            record = json.loads(line)
            if record["committed"]:
                committed[record["round"]] = record
    assert max(committed) == 23, sorted(committed)
    checkpoints = sorted((aggregator / "checkpoints").glob("round-*.pt"))
    assert checkpoints and checkpoints[-1].name == "round-00000023.pt", (
        [c.name for c in checkpoints],
        log[-3000:],
    )
    assert "final checkpoint: round 23 written to " in log or "final checkpoint: none needed" in log, log[
        -3000:
    ]
    history = [json.loads(line) for line in (aggregator / "rounds.jsonl").read_text().splitlines()]
    rounds = {line["round"]: line for line in history if line["kind"] == "round"}
    assert len(rounds) == sum(line["kind"] == "round" for line in history)  # each round once
    assert set(committed) <= set(rounds), (sorted(committed), sorted(rounds))
    for index, report in committed.items():
        line = rounds[index]
        assert line["contributors"] == 2 and line["samples"] == report["swarm_samples"] > 0, (line, report)
        assert line["loss"] > 0 and line["time"] > 0 and line["peers_online"] >= 0


# Slow (make test-all; 35 s): the default suite sums model-parallel cohort means in a real hierarchy
# (tests/peer/averaging/test_hierarchy.py) and averages each weight over the cohorts that trained it
# (tests/peer/test_outer_step.py).
@pytest.mark.slow
def test_model_parallel_cohorts_train_different_subnetworks_into_one_model(tmp_path):
    swarm = run_swarm_to_end(
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


# Slow (make test-all; 134 s, the longest swarm test): the default suite covers its parts one by one:
# a silent roster member (tests/peer/averaging/test_stage_failures.py), a member lost or a leader killed inside a
# round (averaging/test_stage_failures.py, averaging/test_leader_takeover.py), a newcomer loading the swarm's state
# (test_resume_continues_from_the_aggregators_newest_checkpoint), kill -9 (test_join_cli.py).
@pytest.mark.slow
def test_a_silent_peer_a_joiner_and_a_kill_cost_the_others_at_most_one_round(tmp_path):
    """Partial participation, in one swarm: peer 3 announces itself and never averages (in everyone's
    roster the whole run); peer 4 joins while the others train; then peer 2 is killed with kill -9.
    The silent peer and the joiner abort no round of the others; the joiner loads the swarm's state
    and then contributes; the death costs each survivor at most the round it happened in (before, it
    aborted every round for about a minute)."""
    # Rounds whose compute phase (4 mini-batches per peer) outlasts a state download, as real rounds
    # do by far: a joiner that loads the state while the others compute still makes their round.
    options = dict(SMALL, target_samples=384)
    swarm = LocalSwarm(SwarmOptions(peers=5, rounds=10_000, run_dir=tmp_path, **options))
    honest, survivors = (0, 1, 2), (0, 1, 4)
    try:
        swarm.start_aggregator()
        for i in honest:
            swarm.start_peer(i)
        swarm.start_peer(3, command=dishonest_peer.command("silent"))
        wait_until(
            lambda: all(len(_committed(swarm, i)) >= 2 for i in honest), 300, "two rounds of peers 0-2"
        )
        swarm.start_peer(4)
        wait_until(lambda: len(_committed(swarm, 4)) >= 1, 300, "a committed round of the joiner")
        # Each peer writes its round record after its own commit: peer 2's may come a moment after the
        # joiner's. The kill comes after a round both recorded, so some round holds all four of them.
        joined_at = _committed(swarm, 4)[0]["round"]
        wait_until(lambda: any(r["round"] >= joined_at for r in swarm.rounds(2)), 60,
                   "peer 2's record of the joiner's first round")  # fmt: skip
        victim = psutil.Process(swarm.procs["peer-2"].pid)
        family = [victim, *victim.children(recursive=True)]
        os.kill(victim.pid, signal.SIGKILL)
        killed_after = max(r["round"] for r in swarm.rounds(2))

        def two_rounds_after_the_kill(i: int) -> bool:
            return len([r for r in _committed(swarm, i) if r["round"] > killed_after + 1]) >= 2

        wait_until(lambda: all(two_rounds_after_the_kill(i) for i in survivors), 300,
                   "two rounds of the survivors after the kill")  # fmt: skip
        wait_until(lambda: not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in family), 30,
                   "the killed peer's workers and DHT to go")  # fmt: skip
    finally:
        swarm.stop(swarm.peer_names(), grace=5.0)
        swarm.close()
    for i in honest:
        rounds = [r for r in swarm.rounds(i) if r["round"] <= killed_after]
        first = next(k for k, r in enumerate(rounds) if r["committed"])
        aborted = [r for r in rounds[first:-1] if not r["committed"]]  # the last: the kill's round
        assert not aborted, [r["reason"] for r in aborted]
    assert not swarm.rounds(3), "the silent peer never ran a round"
    joiner_log = (tmp_path / "peer-4/log.txt").read_text()
    loaded = re.search(
        r"loaded the swarm's state after round (\d+) \(digest \w+, from (\d+) holder", joiner_log
    )
    assert loaded and int(loaded.group(1)) >= 1, "the joiner did not start from the swarm's state"
    # A round the swarm was computing when the joiner arrived began with rosters that do not hold it:
    # the joiner sits it out (its departure notice keeps it out of that round's quorum).
    sat_out = re.search(r"computing round \d+ \(attempt (\d+)\): taking part from the next one", joiner_log)
    if sat_out:
        assert int(sat_out.group(1)) not in {r["attempt"] for r in swarm.rounds(4)}, sat_out.group(0)
    # ... the state a quorum committed, its pages fetched from every peer that reported it (3 of them)
    assert int(loaded.group(2)) >= 2, loaded.group(0)
    joiner = {r["round"]: r for r in _committed(swarm, 4)}
    others = {r["round"]: r for r in _committed(swarm, 0)}
    shared = sorted(r for r in set(joiner) & set(others) if r <= killed_after)
    assert shared, (sorted(joiner), sorted(others))
    for r in shared:  # the joiner contributed to these rounds and holds what the others hold
        assert joiner[r]["state_digest"] == others[r]["state_digest"]
        assert joiner[r]["contributors"] == others[r]["contributors"] == 4
    for i in survivors:
        after = [r for r in swarm.rounds(i) if r["round"] > killed_after][:-1]  # the last: Ctrl-C's
        assert sum(not r["committed"] for r in after) <= 1, [r["reason"] for r in after]
    later = [
        {r["round"]: r for r in _committed(swarm, i) if r["round"] > killed_after + 1} for i in survivors
    ]
    common = sorted(set(later[0]) & set(later[1]) & set(later[2]))
    assert common, [sorted(x) for x in later]
    for r in common:
        assert len({x[r]["state_digest"] for x in later}) == 1
        assert all(x[r]["contributors"] == 3 for x in later)


def test_resume_continues_from_the_aggregators_newest_checkpoint(manta_swarm_run):
    """`manta-aggregator start --resume` on the data directory of the finished manta-swarm run above
    (every volunteer has left and its aggregator is stopped): a newcomer starts from the newest
    checkpoint and the rounds go on from there."""
    where, done = manta_swarm_run
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run = where / "run"
    events = [json.loads(line) for line in (run / "processes.jsonl").read_text().splitlines()]
    exits = {
        e["name"]: e["returncode"] for e in events if e["event"] == "exit" and e["name"].startswith("peer-")
    }
    assert exits == {"peer-0": 0, "peer-1": 0}, exits  # every volunteer of the first run left cleanly
    checkpoints = sorted((run / "aggregator" / "checkpoints").glob("round-*.pt"))
    assert checkpoints, (run / "aggregator" / "log.txt").read_text()[-3000:]
    saved_round = int(checkpoints[-1].stem.split("-")[1])
    assert saved_round >= 1

    # The run's own task (--resume reads it from the aggregator's data directory), one newcomer.
    options = SwarmOptions(peers=1, rounds=2, run_dir=run, target_samples=64, subnets=2, width_mult="0.25")
    second = LocalSwarm(options)
    try:
        second.start_aggregator(resume=True)
        newcomer = second.start_peer(5)
        assert newcomer.wait(timeout=600) == 0, (run / "peer-5/log.txt").read_text()[-3000:]
    finally:
        second.close()
    log = (run / "peer-5" / "log.txt").read_text()
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
    swarm = run_swarm_to_end(LocalSwarm(options))
    a, b = ({r["round"]: r for r in _committed(swarm, i)} for i in range(2))
    assert sorted(a) == sorted(b) == [0, 1], (a.keys(), b.keys())
    for r in a:
        assert a[r]["state_digest"] == b[r]["state_digest"] and a[r]["contributors"] == 2
        assert a[r]["loss"] > 0 and a[r]["loss"] == a[r]["loss"]  # finite, not NaN
