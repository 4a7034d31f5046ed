"""The aggregator's round history: ``<data dir>/rounds.jsonl`` appended as the monitor learns each
round (real signed records), read back by a restarted monitor, and the same figures as TensorBoard
scalars read back with TensorBoard's own event reader; ``--tensorboard``'s one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time

import pytest

from aggregator.monitor.service import Monitor
from aggregator.monitor.tensorboard import TensorBoardLog
from tests.aggregator.monitor_helpers import ALICE, BOB, announcement, progress, reading

ACCURACY = {"metric": "accuracy", "higher_is_better": True, "largest": 0.875, "smallest": 0.75,
            "checkpoint": "round-00000001.pt", "seconds": 1.5, "evaluated_at": 116.0}  # fmt: skip


def three_rounds(monitor: Monitor) -> list[int]:
    """Alice and Bob (two cohorts) report rounds 0, 1 and the start of 2, as their records would
    arrive; the history is updated after each reading. Returns the lines written at each update."""
    agg, t0, written = monitor.aggregates, int(time.time() * 1000), []
    online = [announcement(ALICE), announcement(BOB)]

    def step(records, seen: float, now: float) -> None:
        agg.observe(reading(announcements=online, records=records), seen)
        written.append(monitor.history.update(agg, now=now))

    step([progress(ALICE, 0, 64, 2.0, 30.0, timestamp=t0),
          progress(BOB, 0, 32, 1.0, 10.0, cohort="cohort-b", timestamp=t0)], 100.0, 101.0)  # fmt: skip
    # Their first records of round 1 carry round 0's final figures: one round behind, just changed.
    step([progress(ALICE, 1, 0, 0.0, 30.0, timestamp=t0 + 1000, finished=(0, 96, 2.0), traffic=(0, 4096)),
          progress(BOB, 1, 0, 0.0, 10.0, cohort="cohort-b", timestamp=t0 + 1000, finished=(0, 32, 1.0),
                   traffic=(0, 1024))], 102.0, 103.0)  # fmt: skip
    # Round 2 begins: round 0 is two rounds behind, final.
    step([progress(ALICE, 2, 16, 1.25, 32.0, timestamp=t0 + 2000, finished=(1, 64, 1.5), traffic=(0, 8192)),
          progress(BOB, 2, 0, 0.0, 8.0, cohort="cohort-b", timestamp=t0 + 2000, finished=(1, 64, 0.5),
                   traffic=(0, 2048))], 104.0, 105.0)  # fmt: skip
    # Nobody reports about round 1 any more and it has not changed for 10 s: final too.
    written.append(monitor.history.update(agg, now=114.0))
    agg.record_validation(1, ACCURACY)  # its checkpoint was evaluated
    written.append(monitor.history.update(agg, now=117.0))
    return written


def test_rounds_are_appended_once_final_and_shown_again_after_a_restart(tmp_path):
    monitor = Monitor(tmp_path, ALICE.public_key, evaluate=False)
    assert three_rounds(monitor) == [0, 0, 1, 1, 1]
    monitor.close()  # writes round 2, still in progress: the aggregator is stopping
    lines = [json.loads(line) for line in (tmp_path / "rounds.jsonl").read_text().splitlines()]
    assert [(line["kind"], line["round"]) for line in lines] == [
        ("round", 0), ("round", 1), ("validation", 1), ("round", 2)]  # fmt: skip
    first = lines[0]
    assert first == {
        "kind": "round", "round": 0, "time": 102.0, "samples": 128, "loss": pytest.approx(1.75),
        "contributors": 2, "peers_online": 2, "throughput": 40.0, "cohorts": ["cohort-a", "cohort-b"],
        "cross_cohort_bytes": 10240, "outer_steps": 0,
    }  # fmt: skip
    assert lines[1]["samples"] == 128 and lines[1]["loss"] == pytest.approx(1.0)
    assert lines[2]["validation"] == {k: ACCURACY[k] for k in ("metric", "higher_is_better", "largest",
                                                              "smallest", "checkpoint")}  # fmt: skip
    assert lines[2]["time"] == 116.0
    assert lines[3]["samples"] == 16 and lines[3]["contributors"] == 2

    # A restarted aggregator shows the rounds it saw before, and writes none of them twice.
    again = Monitor(tmp_path, ALICE.public_key, evaluate=False)
    rows = {r["round"]: r for r in again.aggregates.rounds()}
    assert sorted(rows) == [0, 1, 2] and rows[0]["samples"] == 128 and rows[0]["peers"] == 2
    assert rows[1]["validation"]["largest"] == 0.875 and rows[0]["loss"] == pytest.approx(1.75)
    assert again.aggregates.latest_validation()["round"] == 1
    t0 = int(time.time() * 1000)
    again.aggregates.observe(
        reading(records=[progress(ALICE, 3, 8, 1.0, timestamp=t0, finished=(2, 48, 1.1))]), 200.0
    )
    again.close()
    more = [json.loads(line) for line in (tmp_path / "rounds.jsonl").read_text().splitlines()][4:]
    assert [(line["kind"], line["round"]) for line in more] == [("round", 3)]


def test_tensorboard_scalars_read_back_with_tensorboards_own_reader(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (tmp_path / "data").mkdir()
    monitor = Monitor(tmp_path / "data", ALICE.public_key, evaluate=False,
                      tensorboard=TensorBoardLog(tmp_path / "tb"))  # fmt: skip
    three_rounds(monitor)
    monitor.close()

    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    scalars = {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}
    assert set(scalars) == {
        "train/loss", "train/samples", "train/throughput_samples_per_s", "swarm/peers_online",
        "swarm/contributors", "traffic/cross_cohort_bytes", "validation/accuracy/largest",
        "validation/accuracy/smallest",
    }  # fmt: skip
    assert scalars["train/loss"] == [
        (0, pytest.approx(1.75)),
        (1, pytest.approx(1.0)),
        (2, pytest.approx(1.25)),
    ]
    assert scalars["train/samples"] == [(0, 128), (1, 128), (2, 16)]
    assert scalars["train/throughput_samples_per_s"][0] == (0, 40.0)
    assert scalars["swarm/peers_online"] == [(0, 2), (1, 2), (2, 2)]
    assert scalars["swarm/contributors"] == [(0, 2), (1, 2), (2, 2)]
    assert scalars["traffic/cross_cohort_bytes"] == [(0, 10240), (1, 10240), (2, 10240)]
    assert scalars["validation/accuracy/largest"] == [(1, 0.875)]
    assert scalars["validation/accuracy/smallest"] == [(1, 0.75)]
    assert events.Scalars("validation/accuracy/largest")[0].wall_time == 116.0


START = ["start", "--task", "digits", "--http", "off", "--listen", "127.0.0.1:0"]


def _start(tmp_path, *args: str, block_tensorboard: bool = False) -> subprocess.CompletedProcess:
    """``manta-aggregator start`` in a child interpreter (with the tensorboard package made
    unimportable there if asked); it must fail before its DHT node starts."""
    code = textwrap.dedent(
        f"""
        import sys
        if {block_tensorboard}:
            sys.modules["tensorboard"] = None
        from aggregator.cli import main
        sys.argv[0] = "manta-aggregator"
        main()
        """
    )
    argv = [*START, "--identity", str(tmp_path / "id.key"), "--data-dir", str(tmp_path / "agg"), *args]
    return subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=180)


def test_tensorboard_without_its_package_or_with_an_unusable_directory_is_one_line(tmp_path):
    missing = _start(tmp_path, "--tensorboard", str(tmp_path / "tb"), block_tensorboard=True)
    assert missing.returncode == 1, missing.stderr
    assert missing.stderr.strip().splitlines() == [
        "Error: --tensorboard needs the tensorboard package: pip install tensorboard"
    ]
    (tmp_path / "a-file").write_text("not a directory")
    unusable = _start(tmp_path, "--tensorboard", str(tmp_path / "a-file" / "tb"))
    assert unusable.returncode == 1, unusable.stderr
    (line,) = unusable.stderr.strip().splitlines()
    assert line.startswith(f"Error: --tensorboard {tmp_path / 'a-file' / 'tb'}: "), line
