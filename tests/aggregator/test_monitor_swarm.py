"""The dashboard's JSON API and /metrics while a real local swarm trains (console-script processes:
one `manta-aggregator start --http ...`, two `manta-peer join`)."""

from __future__ import annotations

import json
import math
import time

import pytest

from testbed.local_swarm import LocalSwarm, SwarmOptions
from tests.aggregator.monitor_helpers import free_port, get_json, http, parse_exposition

pytestmark = pytest.mark.swarm

SMALL = dict(target_samples=96, batch_size=32, subnets=2, width_mult="0.25", head_channels=64)


def _peer_ids(swarm: LocalSwarm) -> set[str]:
    return {r["peer_id"] for i in range(2) for r in swarm.rounds(i)}


@pytest.mark.slow  # 43 s; a real swarm behind the same API: test_monitor_browser (slow), figures: test_monitor
def test_api_and_metrics_follow_a_real_swarm(tmp_path):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    swarm = LocalSwarm(SwarmOptions(peers=2, rounds=6, run_dir=tmp_path, **SMALL))
    statuses, peer_tables, metric_pages = [], [], []
    try:
        swarm.start_aggregator(checkpoint_every=2.0, extra_args=("--http", f"127.0.0.1:{port}"))
        assert f"Dashboard: {base}/" in (tmp_path / "aggregator" / "log.txt").read_text()
        for i in range(2):
            swarm.start_peer(i)
        deadline = time.monotonic() + 240
        while swarm.peers_running():
            assert time.monotonic() < deadline, "the swarm did not finish its rounds in time"
            statuses.append(get_json(f"{base}/api/status"))
            peer_tables.append(get_json(f"{base}/api/peers")["peers"])
            status, headers, body = http(f"{base}/metrics")
            assert status == 200 and headers["Content-Type"].startswith("text/plain; version=0.0.4"), headers
            metric_pages.append(parse_exposition(body.decode()))
            time.sleep(1.0)
        for i in range(2):
            assert swarm.procs[f"peer-{i}"].wait(timeout=60) == 0, (
                tmp_path / f"peer-{i}/log.txt"
            ).read_text()[-3000:]

        # After the run the aggregator still serves; the newest checkpoint gets evaluated.
        deadline = time.monotonic() + 90
        while (final := get_json(f"{base}/api/status"))["validation"] is None:
            assert time.monotonic() < deadline, f"no checkpoint was evaluated: {final['monitor']}"
            time.sleep(1.0)
        rounds = get_json(f"{base}/api/rounds")["rounds"]
        metrics = parse_exposition(http(f"{base}/metrics")[2].decode())

        # Bad input and methods that would change state.
        bad = {
            ("GET", "/api/nope"): 404,
            ("GET", "/api/ledger/proof/999999"): 404,
            ("GET", "/api/ledger/proof/-1"): 404,
            ("GET", "/static/../pyproject.toml"): 404,
            ("POST", "/api/status"): 405,
            ("PUT", "/api/peers"): 405,
            ("DELETE", "/metrics"): 405,
            ("PATCH", "/api/rounds"): 405,
        }
        answers = {key: http(base + key[1], key[0]) for key in bad}
    finally:
        swarm.close()

    for (method, path), expected in bad.items():
        status, headers, body = answers[(method, path)]
        assert status == expected, (method, path, status, body)
        assert json.loads(body)["error"], (method, path, body)
        if expected == 405:
            assert set(headers["Allow"].split(", ")) == {"GET", "HEAD"}

    ids = _peer_ids(swarm)
    assert len(ids) == 2
    # The status saw both peers online, training, with the task's round target and schedule.
    assert max(s["peers_online"] for s in statuses) == 2
    assert all(s["task"]["task_id"] == "digits-local" and s["task"]["total_rounds"] == 6 for s in statuses)
    assert any(s["round"]["activity"] == "training" and s["throughput"] > 0 for s in statuses)
    assert {s["round"]["phase"] for s in statuses if s["round"]["current"] is not None} <= {"sandwich"}
    assert max(s["round"]["current"] or 0 for s in statuses) >= 2
    # The peers table listed exactly the two peers, online, with a device, a cohort and a throughput.
    both_online = [t for t in peer_tables if sum(p["online"] for p in t) == 2]
    assert both_online, peer_tables[-1]
    assert {p["peer_id"] for p in both_online[-1]} == ids
    assert all("cpu" in p["device"] and p["cohort"] for p in both_online[-1])
    assert any(p["throughput"] > 0 for t in both_online for p in t)

    # Per-round aggregates agree with what the peers recorded themselves.
    committed = {r["round"]: r for i in range(2) for r in swarm.rounds(i) if r["committed"]}
    by_round = {r["round"]: r for r in rounds}
    assert set(committed) <= set(by_round), (sorted(committed), sorted(by_round))
    for index, report in committed.items():
        row = by_round[index]
        # Exact: every progress record repeats its peer's final figures of the round before.
        assert row["peers"] == 2 and row["samples"] == report["swarm_samples"] > 0, (row, report)
        losses = [r["loss"] for i in range(2) for r in swarm.rounds(i) if r["round"] == index]
        assert row["loss"] is not None and 0.5 * min(losses) <= row["loss"] <= 2 * max(losses), (row, losses)
    assert final["validation"]["metric"] == "accuracy"
    assert 0.0 <= final["validation"]["largest"] <= 1.0 and 0.0 <= final["validation"]["smallest"] <= 1.0
    assert by_round[final["validation"]["round"]]["validation"]["largest"] == final["validation"]["largest"]

    # /metrics carried the same figures.
    assert max(m["manta_peers_online"][0][1] for m in metric_pages) == 2
    per_peer = [m for m in metric_pages if len(m.get("manta_peer_throughput_samples_per_second", [])) == 2]
    assert (
        per_peer
        and {labels["peer_id"] for labels, _ in per_peer[-1]["manta_peer_throughput_samples_per_second"]}
        == ids
    )
    assert metrics["manta_task_info"][0][0]["task_id"] == "digits-local"
    assert metrics["manta_samples_total"][0][1] == sum(r["samples"] for r in rounds)
    assert metrics["manta_rounds_observed"][0][1] >= len(committed)
    largest = [v for labels, v in metrics["manta_validation_metric"] if labels["subnet"] == "largest"]
    assert largest == [final["validation"]["largest"]] and not math.isnan(largest[0])
    assert metrics["manta_checkpoint_round"][0][1] >= final["validation"]["round"]
