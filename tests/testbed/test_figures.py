"""The run's figures from the files a manta-swarm run writes (processes.jsonl, each peer's
rounds.jsonl), written here in their real format."""

from __future__ import annotations

import json
from pathlib import Path

from testbed.figures import peer_figures, swarm_figures


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _round(n: int, at: float, committed: bool, samples: int = 64) -> dict:
    return {
        "round": n, "attempt": n, "committed": committed, "samples": samples, "time": at, "seconds": 10.0,
        "reason": "" if committed else "no quorum within 6 s: 2 of 4 roster peer(s) reported this result",
        "times": {"compute": 4.0, "averaging": 5.0, "waiting": 1.0},
        "stages": {"compute": 4.0, "cohort": 2.0, "cross": 2.0, "broadcast": 1.0, "commit": 0.5, "other": 0.5},
    }  # fmt: skip


def test_joiners_first_contribution_and_how_long_they_ran(tmp_path):
    _write_jsonl(tmp_path / "processes.jsonl", [
        {"name": "peer-0", "event": "start", "time": 100.0},
        {"name": "peer-1", "event": "start", "time": 150.0},  # joins after the first commit (at 120)
        {"name": "peer-2", "event": "start", "time": 160.0},
        {"name": "peer-2", "event": "signal-kill", "time": 190.0},
        {"name": "peer-2", "event": "exit", "time": 191.0, "returncode": -9},
        {"name": "peer-0", "event": "signal-term", "time": 300.0},
        {"name": "peer-0", "event": "exit", "time": 302.0, "returncode": 0},
        {"name": "peer-1", "event": "signal-term", "time": 300.0},
        {"name": "peer-1", "event": "exit", "time": 303.0, "returncode": 0},
        # a joiner the run's end asked to leave 20 s after its start: it finishes its round (40 s more)
        {"name": "peer-3", "event": "start", "time": 280.0},
        {"name": "peer-3", "event": "signal-term", "time": 300.0},
        {"name": "peer-3", "event": "exit", "time": 340.0, "returncode": 0},
    ])  # fmt: skip
    _write_jsonl(tmp_path / "peer-0" / "rounds.jsonl", [_round(0, 120.0, True), _round(1, 200.0, True)])
    # peer-1: its first round aborted, its second committed without samples, its third contributed
    _write_jsonl(
        tmp_path / "peer-1" / "rounds.jsonl",
        [_round(1, 180.0, False), _round(2, 200.0, True, samples=0), _round(3, 215.5, True)],
    )
    _write_jsonl(tmp_path / "peer-2" / "rounds.jsonl", [_round(1, 185.0, False)])

    peers = {p.name: p for p in peer_figures(tmp_path)}
    assert not peers["peer-0"].joiner and peers["peer-1"].joiner and peers["peer-2"].joiner
    assert peers["peer-1"].first_contribution_s == 65.5  # 215.5 - 150: the round with samples
    assert peers["peer-2"].first_contribution_s is None
    # how long each ran: until it was told to stop or killed (no round of its own comes after that)
    lived = [peers[f"peer-{i}"].lived_s for i in range(4)]
    assert lived == [200.0, 150.0, 30.0, 20.0]
    assert (peers["peer-2"].ended, peers["peer-1"].rounds_aborted) == ("killed", 1)
    assert [peers[f"peer-{i}"].rounds_aborted_leaving for i in range(4)] == [0, 0, 0, 0]

    swarm = swarm_figures(list(peers.values()), None, total_samples=256)
    assert swarm["joiners"] == {"peer-1": 65.5, "peer-2": None, "peer-3": None}
    assert swarm["joiners_lived_s"] == {"peer-1": 150.0, "peer-2": 30.0, "peer-3": 20.0}
    assert swarm["peer_rounds_committed"] == 4 and swarm["peer_rounds_aborted"] == 2


def test_a_round_committed_late_counts_once_as_committed(tmp_path):
    _write_jsonl(tmp_path / "processes.jsonl", [
        {"name": "peer-0", "event": "start", "time": 100.0},
        {"name": "peer-0", "event": "exit", "time": 300.0, "returncode": 0},
    ])  # fmt: skip
    late = {**_round(4, 160.0, True), "late": True, "reason": ""}
    rows = [_round(3, 120.0, True), _round(4, 140.0, False), late, _round(5, 180.0, False)]
    _write_jsonl(tmp_path / "peer-0" / "rounds.jsonl", rows)
    (fig,) = peer_figures(tmp_path)
    # round 4 aborted here, and its result found a quorum before round 5: committed, late
    assert (fig.rounds_committed, fig.rounds_committed_late, fig.rounds_aborted) == (2, 1, 1)
    assert sum(fig.abort_reasons.values()) == 1
    swarm = swarm_figures([fig], None, total_samples=192)
    assert (swarm["peer_rounds_committed"], swarm["peer_rounds_aborted"], swarm["peer_rounds_committed_late"]) == (
        2, 1, 1,
    )  # fmt: skip


def test_rounds_that_abort_after_the_stop_are_counted_apart(tmp_path):
    _write_jsonl(tmp_path / "processes.jsonl", [
        {"name": "peer-0", "event": "start", "time": 100.0},
        {"name": "peer-0", "event": "signal-term", "time": 200.0},
        {"name": "peer-0", "event": "exit", "time": 215.0, "returncode": 0},
    ])  # fmt: skip
    # round 2 aborted while churn went on; round 4 ended after the run's stop reached the peer
    rows = [_round(1, 130.0, True), _round(2, 150.0, False), _round(3, 170.0, True), _round(4, 210.0, False)]
    _write_jsonl(tmp_path / "peer-0" / "rounds.jsonl", rows)
    (fig,) = peer_figures(tmp_path)
    assert (fig.rounds_aborted, fig.rounds_aborted_leaving) == (2, 1)
    assert swarm_figures([fig], None, total_samples=128)["peer_rounds_aborted_leaving"] == 1


def _sent(row: dict, messages: int, size: int) -> dict:
    return {**row, "control_messages": messages, "control_bytes": size}


def test_coordination_per_peer_round_is_the_mean_over_every_reported_round(tmp_path):
    _write_jsonl(tmp_path / "processes.jsonl", [
        {"name": "peer-0", "event": "start", "time": 100.0},
        {"name": "peer-1", "event": "start", "time": 100.0},
    ])  # fmt: skip
    _write_jsonl(tmp_path / "peer-0" / "rounds.jsonl", [
        _sent(_round(0, 120.0, True), 300, 400_000), _sent(_round(1, 130.0, False), 100, 50_000),
    ])  # fmt: skip
    _write_jsonl(tmp_path / "peer-1" / "rounds.jsonl", [_sent(_round(0, 121.0, True), 200, 150_000)])
    swarm = swarm_figures(peer_figures(tmp_path), None, total_samples=128)
    assert swarm["control_bytes_per_peer_round"] == 200_000  # 600,000 bytes over three peer-rounds
    assert swarm["control_messages_per_peer_round"] == 200.0
