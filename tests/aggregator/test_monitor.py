"""The monitor's aggregation and its Prometheus page, from real signed records (real Ed25519 keys)."""

from __future__ import annotations

import json
import math
import time

import hivemind
import pytest
from hivemind.utils import get_dht_time

from aggregator.monitor.aggregates import SwarmAggregates, describe_devices
from aggregator.monitor.history import RoundHistory
from aggregator.monitor.metrics import escape_label, format_value, render_metrics
from aggregator.monitor.service import Monitor
from aggregator.monitor.swarm_reader import read_swarm
from protocol.dht_schema import peers_key, progress_key
from protocol.records import DeviceInfo
from protocol.sealing import seal
from tests.aggregator.monitor_helpers import (
    ALICE,
    BOB,
    CAROL,
    TASK_ID,
    announcement,
    announcement_value,
    parse_exposition,
    progress,
    reading,
)
from tests.protocol.factories import peer_id_of


def test_a_round_is_the_sample_weighted_mean_of_each_peers_latest_report():
    agg = SwarmAggregates()
    t0 = int(time.time() * 1000)
    agg.observe(reading(records=[progress(ALICE, 3, 40, 2.5, 20.0, timestamp=t0)]), 100.0)
    agg.observe(
        reading(
            records=[
                progress(ALICE, 3, 100, 2.0, 25.0, timestamp=t0 + 1000),  # replaces Alice's first report
                progress(BOB, 3, 300, 1.0, 75.0, cohort="cohort-b", timestamp=t0 + 900),
            ]
        ),
        102.0,
    )
    # A reading that still carries an older record of Alice (a stale DHT node) changes nothing.
    agg.observe(reading(records=[progress(ALICE, 3, 40, 2.5, 20.0, timestamp=t0)]), 104.0)
    (row,) = agg.rounds()
    assert row["round"] == 3 and row["samples"] == 400 and row["peers"] == 2
    assert row["loss"] == pytest.approx((2.0 * 100 + 1.0 * 300) / 400)
    assert row["throughput"] == pytest.approx(100.0)
    assert row["cohorts"] == ["cohort-a", "cohort-b"]
    assert row["first_seen"] == 100.0 and row["last_change"] == 102.0

    # The next round starts; round 3 keeps its figures and the current round moves on.
    agg.observe(reading(records=[progress(ALICE, 4, 32, 1.5, timestamp=t0 + 3000)]), 106.0)
    assert [r["round"] for r in agg.rounds()] == [3, 4]
    assert agg.rounds()[0]["samples"] == 400
    assert agg.current_round() == 4
    assert [r["round"] for r in agg.rounds(since=4)] == [4]


def test_a_rounds_final_figures_come_from_the_peers_next_records():
    # Rounds shorter than a reading interval: the monitor only ever saw each peer's first report of
    # round 3 (nothing computed yet); their round-4 records carry round 3's final figures.
    agg = SwarmAggregates()
    t0 = int(time.time() * 1000)
    agg.observe(reading(records=[progress(ALICE, 3, 0, 0.0, timestamp=t0), progress(BOB, 3, 0, 0.0)]), 1.0)
    assert agg.rounds()[0]["samples"] == 0 and agg.rounds()[0]["loss"] is None
    agg.observe(
        reading(
            records=[
                progress(ALICE, 4, 0, 0.0, timestamp=t0 + 2000, finished=(3, 96, 2.0)),
                progress(BOB, 4, 32, 1.5, timestamp=t0 + 2100, finished=(3, 32, 1.0)),
            ]
        ),
        3.0,
    )
    row3, row4 = agg.rounds()
    assert row3["round"] == 3 and row3["samples"] == 128 and row3["peers"] == 2
    assert row3["loss"] == pytest.approx((2.0 * 96 + 1.0 * 32) / 128)
    assert row3["last_change"] == 3.0
    assert row4["samples"] == 32  # the round in progress still counts its in-round reports
    # A stale in-round report of round 3 seen later does not undo the final figures.
    agg.observe(reading(records=[progress(ALICE, 3, 64, 2.5, timestamp=t0 + 500)]), 4.0)
    assert agg.rounds()[0]["samples"] == 128


def test_a_round_without_samples_has_no_loss_and_validation_joins_its_round():
    agg = SwarmAggregates()
    agg.observe(reading(records=[progress(ALICE, 0, 0, 0.0)]), 1.0)
    agg.record_validation(0, {"metric": "accuracy", "largest": 0.5, "smallest": 0.25})
    agg.record_validation(7, {"metric": "accuracy", "largest": 0.75, "smallest": 0.5})
    rows = {r["round"]: r for r in agg.rounds()}
    assert rows[0]["loss"] is None and rows[0]["validation"]["largest"] == 0.5
    assert rows[7]["peers"] == 0 and rows[7]["validation"]["smallest"] == 0.5  # a checkpoint-only round
    assert agg.latest_validation() == {"round": 7, "metric": "accuracy", "largest": 0.75, "smallest": 0.5}


def test_only_the_newest_rounds_are_kept():
    agg = SwarmAggregates(max_rounds=3)
    for r in range(6):
        agg.observe(reading(records=[progress(ALICE, r, 10, 1.0)]), float(r))
    agg.observe(reading(records=[progress(BOB, 1, 10, 1.0)]), 10.0)  # older than all kept rounds
    assert [r["round"] for r in agg.rounds()] == [3, 4, 5]


def test_peers_online_withdrawn_and_gone_with_last_seen_on_the_local_clock():
    agg = SwarmAggregates(forget_after=60.0)
    skewed = int(time.time() * 1000) + 3_600_000  # Bob's clock is an hour fast: it must not matter
    agg.observe(
        reading(
            [announcement(ALICE, 12.0), announcement(BOB, 8.0, timestamp=skewed), announcement(CAROL, 5.0)],
            [progress(ALICE, 2, 64, 1.2, throughput=30.0)],
        ),
        1000.0,
    )
    rows = {r["peer_id"]: r for r in agg.peers(1001.0)}
    alice, bob = rows[peer_id_of(ALICE)], rows[peer_id_of(BOB)]
    assert alice["online"] and alice["computing"] and alice["throughput"] == 30.0  # live, from its progress
    assert alice["cohort"] == "cohort-a" and alice["round"] == 2 and alice["loss"] == pytest.approx(1.2)
    assert bob["online"] and not bob["computing"] and bob["throughput"] == 8.0  # from its announcement
    assert bob["cohort"] == "auto" and bob["device"] == "cpu: test cpu"
    assert bob["last_seen"] == 1000.0 and bob["seconds_since_seen"] == 1.0
    assert agg.activity(1001.0) == "training"

    # Later: Bob withdrew (throughput 0), Carol's announcement expired, Alice is between rounds.
    agg.observe(
        reading(
            [announcement(ALICE, 12.0), announcement(BOB, 0.0, timestamp=skewed + 1)],
            [progress(ALICE, 2, 64, 1.2, throughput=30.0, timestamp=0)],
        ),
        1030.0,
    )
    rows = {r["peer_id"]: r for r in agg.peers(1030.0)}
    assert rows[peer_id_of(ALICE)]["online"] and not rows[peer_id_of(ALICE)]["computing"]
    assert not rows[peer_id_of(BOB)]["online"] and rows[peer_id_of(BOB)]["last_seen"] == 1030.0
    assert not rows[peer_id_of(CAROL)]["online"] and rows[peer_id_of(CAROL)]["last_seen"] == 1000.0
    assert rows[peer_id_of(CAROL)]["throughput"] == 0.0
    assert [r["online"] for r in agg.peers(1030.0)] == [True, False, False]  # online first
    assert agg.activity(1030.0) == "between rounds"

    # A peer offline for longer than forget_after leaves the table.
    agg.observe(reading([announcement(ALICE, 12.0, timestamp=int(time.time() * 1000) + 5)]), 1070.0)
    assert {r["peer_id"] for r in agg.peers(1070.0)} == {peer_id_of(ALICE), peer_id_of(BOB)}
    agg.observe(reading(), 1200.0)
    assert agg.peers(1200.0) == [] and agg.activity(1200.0) == "idle"


def test_a_peer_averaging_its_round_is_online_but_not_computing():
    agg = SwarmAggregates()
    # signed 10 s apart, as the monitor's clock reads them (both made at once could share a millisecond,
    # and a record no newer than the one held is not taken)
    signed = int(time.time() * 1000)
    averaging = progress(ALICE, 2, 64, 1.2, throughput=30.0, averaging=True, timestamp=signed)
    agg.observe(reading(records=[averaging]), 1000.0)
    (alice,) = agg.peers(1001.0)
    assert alice["online"] and alice["averaging"] and not alice["computing"]
    assert alice["round"] == 2 and alice["samples"] == 64
    assert agg.activity(1001.0) == "between rounds"
    computing = progress(ALICE, 3, 16, 1.1, throughput=30.0, timestamp=signed + 10_000)
    agg.observe(reading(records=[computing]), 1010.0)
    (alice,) = agg.peers(1011.0)
    assert alice["computing"] and not alice["averaging"] and agg.activity(1011.0) == "training"


def test_devices_are_summarised_per_kind_and_name():
    devices = (
        DeviceInfo(kind="cuda", name="H100", memory_mb=80_000),
        DeviceInfo(kind="cuda", name="H100", memory_mb=80_000),
        DeviceInfo(kind="cpu", name="EPYC", memory_mb=0),
    )
    assert describe_devices(devices) == "cuda: H100 x2, cpu: EPYC"


def test_read_swarm_reverifies_what_an_unvalidated_dht_hands_back():
    dht = hivemind.DHT(host_maddrs=["/ip4/127.0.0.1/tcp/0"], start=True)  # no MANTA validator on it
    try:
        expiration = get_dht_time() + 60
        alice_record = progress(ALICE, 5, 64, 1.5)
        dht.store(progress_key(TASK_ID), seal(alice_record, ALICE), expiration, subkey=ALICE.public_key_hex)
        # Bob's record stored under Alice's key (an impersonation) and a progress record of another task.
        forged = seal(progress(BOB, 5, 10**6, 0.0), BOB)
        dht.store(progress_key(TASK_ID), forged, expiration, subkey=CAROL.public_key_hex)
        dht.store(progress_key(TASK_ID), b"not a record", expiration, subkey=BOB.public_key_hex)
        dht.store(peers_key(TASK_ID), announcement_value(ALICE), expiration, subkey=ALICE.public_key_hex)
        dht.store(peers_key(TASK_ID), announcement_value(BOB), expiration, subkey=ALICE.public_key_hex + "x")
        got = read_swarm(dht, TASK_ID)
    finally:
        dht.shutdown()
    assert got.progress == (alice_record,)
    assert [a.peer_id for a in got.announcements] == [peer_id_of(ALICE)]
    assert got.rejected == 3


def test_metrics_page_is_valid_exposition_with_the_swarms_figures(tmp_path):
    monitor = Monitor(tmp_path, ALICE.public_key, evaluate=False)
    now_ms = int(time.time() * 1000)
    monitor.aggregates.observe(
        reading(
            [announcement(ALICE), announcement(BOB)],
            [
                progress(ALICE, 6, 100, 2.0, 40.0, timestamp=now_ms),
                progress(BOB, 6, 300, 1.0, 60.0, cohort="cohort:b/1"),
            ],
            rejected=2,
        ),
        time.time(),
    )
    monitor.aggregates.observe(
        reading([announcement(ALICE), announcement(BOB)], [progress(ALICE, 7, 8, 1.0)]), time.time()
    )
    monitor.aggregates.record_validation(6, {"metric": "accuracy", "largest": 0.875, "smallest": 0.5})
    page = monitor.metrics()
    metrics = parse_exposition(page)
    value = {name: samples[0][1] for name, samples in metrics.items() if len(samples) == 1}
    assert all(name.startswith("manta_") for name in metrics)
    assert value["manta_peers_online"] == 2
    assert value["manta_round_current"] == 7 and value["manta_round_samples"] == 8
    assert value["manta_last_round"] == 6 and value["manta_last_round_samples"] == 400
    assert value["manta_last_round_loss"] == pytest.approx(1.25)
    assert value["manta_samples_total"] == 408 and value["manta_rounds_observed"] == 2
    assert value["manta_monitor_rejected_records_total"] == 2 and value["manta_monitor_readings_total"] == 2
    assert value["manta_ledger_present"] == 0 and "manta_ledger_entries" not in metrics
    throughput = {
        labels["peer_id"]: (labels["cohort"], v)
        for labels, v in metrics["manta_peer_throughput_samples_per_second"]
    }
    assert throughput[peer_id_of(ALICE)] == ("cohort-a", 10.0)  # from Alice's live round-7 report
    assert throughput[peer_id_of(BOB)] == ("cohort:b/1", 10.0)  # Bob reports nothing now: his announcement
    assert {labels["subnet"]: v for labels, v in metrics["manta_validation_metric"]} == {
        "largest": 0.875,
        "smallest": 0.5,
    }
    assert "manta_task_info" not in metrics  # no task yet: the page leaves it out rather than inventing one


def test_exposition_values_and_labels_are_escaped():
    assert escape_label('a"b\\c\nd') == 'a\\"b\\\\c\\nd'
    assert [format_value(v) for v in (3, 0.5, math.nan, math.inf, -math.inf, True)] == [
        "3",
        "0.5",
        "NaN",
        "+Inf",
        "-Inf",
        "1",
    ]


def test_metrics_without_any_data_still_parse():
    status = {
        "round": {"current": None, "samples": 0, "target": None},
        "peers_online": 0,
        "cohorts": [],
        "throughput": 0.0,
        "totals": {"rounds": 0, "samples": 0},
        "monitor": {"readings": 0, "rejected": 0, "last_reading": None, "evaluations": 0},
    }
    metrics = parse_exposition(render_metrics(status, [], {"present": False}))
    assert metrics["manta_peers_online"] == [({}, 0.0)] and "manta_round_current" not in metrics


def test_the_dashboard_shows_outer_steps_and_the_bytes_that_crossed_between_cohorts(tmp_path):
    """Peers sign their outer steps and cross-cohort bytes into their progress records: the status
    shows the swarm's outer steps (the most any peer took) and the bytes of all peers, including a peer
    that left since; the metrics page carries both."""
    monitor = Monitor(tmp_path, ALICE.public_key, evaluate=False)
    agg = SwarmAggregates(forget_after=10.0)
    monitor.aggregates = agg
    t0 = int(time.time() * 1000)
    agg.observe(
        reading(
            [announcement(ALICE), announcement(BOB)],
            [
                progress(ALICE, 9, 10, 1.0, timestamp=t0, traffic=(2, 3_000_000)),
                progress(BOB, 9, 10, 1.0, cohort="cohort-b", timestamp=t0, traffic=(3, 5_000_000)),
            ],
        ),
        100.0,
    )
    assert monitor.status()["traffic"] == {"outer_steps": 3, "cross_cohort_bytes": 8_000_000}
    # Bob leaves (no record, no announcement) and is forgotten: his bytes still count
    agg.observe(
        reading(
            [announcement(ALICE)], [progress(ALICE, 10, 4, 1.0, timestamp=t0 + 1, traffic=(3, 4_000_000))]
        ),
        200.0,
    )
    assert monitor.status()["traffic"] == {"outer_steps": 3, "cross_cohort_bytes": 9_000_000}
    metrics = parse_exposition(monitor.metrics())
    assert metrics["manta_outer_steps"][0][1] == 3
    assert metrics["manta_cross_cohort_bytes_total"][0][1] == 9_000_000


def test_a_credited_round_is_final_with_the_ledgers_figures_whatever_the_readings_missed(tmp_path):
    # Bob's final record of round 4 was never read (it lived one round, between two readings): the
    # progress records alone would count his start-of-round 0. The ledger credited both.
    agg = SwarmAggregates()
    agg.crediting = True
    t0 = int(time.time() * 1000)
    agg.observe(
        reading(records=[progress(ALICE, 4, 64, 2.0, timestamp=t0), progress(BOB, 4, 0, 0.0, timestamp=t0)]),
        1.0,
    )
    agg.observe(
        reading(records=[progress(ALICE, 7, 10, 1.0, timestamp=t0 + 9000, finished=(6, 64, 1.5))]), 9.0
    )
    history = RoundHistory(tmp_path / "rounds.jsonl")
    assert history.update(agg, now=30.0) == 0  # behind the newest, quiet for long: not final uncredited
    alice, bob, carol = (peer_id_of(i) for i in (ALICE, BOB, CAROL))
    agg.credit(4, {alice: 64, bob: 64}, 31.0)
    # late records naming other samples for round 4, and Carol's claim of it, change no sample count
    # (Bob's loss, which only his records tell, is taken)
    late = progress(CAROL, 5, 0, 0.0, timestamp=t0 + 9500, finished=(4, 500, 0.1))
    agg.observe(
        reading(records=[late, progress(BOB, 5, 0, 0.0, timestamp=t0 + 9600, finished=(4, 7, 9.0))]), 32.0
    )
    assert history.update(agg, now=33.0) == 1
    (line,) = [json.loads(x) for x in (tmp_path / "rounds.jsonl").read_text().splitlines()]
    assert (line["round"], line["samples"], line["contributors"]) == (4, 128, 2)
    assert line["loss"] == pytest.approx((2.0 * 64 + 9.0 * 64) / 128)  # the losses the two reported
    assert history.update(agg, now=40.0) == 0  # written once
