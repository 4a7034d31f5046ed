"""A real local swarm whose rounds commit certificates decide (``commit = "certificates"``): full
peers in two cohorts, planning from their rosters until the aggregator's cohort directory governs,
then from it; every process a real console script on 127.0.0.1."""

from __future__ import annotations

import pytest

from testbed.local_swarm import LocalSwarm, SwarmOptions
from tests.helpers import wait_until

pytestmark = pytest.mark.swarm

SMALL = dict(target_samples=96, batch_size=32, subnets=2, width_mult="0.25", head_channels=64)


def test_a_peer_joining_a_certificate_swarm_takes_part_once_a_directory_epoch_lists_it(tmp_path):
    """Two peers train on the directory's cohorts; a third joins. The directory that governs the
    swarm's attempts does not list it until the aggregator signs an epoch that does: it takes part
    from then on, holds what the others hold, and the first two abort nothing meanwhile."""
    swarm = LocalSwarm(
        SwarmOptions(peers=3, cohorts=2, rounds=10_000, run_dir=tmp_path, commit="certificates", **SMALL)
    )

    def committed(i: int) -> list[dict]:
        return [r for r in swarm.rounds(i) if r["committed"]]

    def log(i: int) -> str:
        return (swarm.peer_dir(i) / "log.txt").read_text()

    try:
        swarm.start_aggregator()
        for i in (0, 1):
            swarm.start_peer(i)
        wait_until(
            lambda: all("2 member(s) in 2 cohort(s)" in log(i) and committed(i) for i in (0, 1)),
            180,
            "the first two peers to plan from a directory",
        )
        swarm.start_peer(2)
        wait_until(lambda: len(committed(2)) >= 2, 240, "two committed rounds of the joiner")
    finally:
        swarm.stop(swarm.peer_names(), grace=5.0)
        swarm.close()
    assert all("rounds commit on certificates" in log(i) for i in range(3))
    joiner = log(2)
    assert "3 member(s) in 2 cohort(s)" in joiner  # it planned from an epoch that lists it
    if "in no cohort of directory epoch" in joiner:  # unless that epoch governed by its first round
        assert "for a directory epoch that lists this peer" in joiner
    others = {r["round"]: r for r in committed(0)}
    second = {r["round"]: r["state_digest"] for r in committed(1)}
    assert second and all(others[k]["state_digest"] == d for k, d in second.items() if k in others)
    for r in committed(2):
        assert r["contributors"] == 3 and others[r["round"]]["state_digest"] == r["state_digest"], r
    for i in (0, 1):
        rounds = swarm.rounds(i)[:-1]  # the last: the one the stop ended
        first = next(k for k, r in enumerate(rounds) if r["committed"])
        assert all(r["committed"] for r in rounds[first:]), [
            r["reason"] for r in rounds if not r["committed"]
        ]
    # two cohorts: every committed round crossed between them
    assert {r["cohort"] for r in committed(0)}.isdisjoint(r["cohort"] for r in committed(1))
