"""A real local swarm whose rounds commit certificates decide (``commit = "certificates"``): three
full peers in two cohorts, every process a real console script on 127.0.0.1."""

from __future__ import annotations

import re

import pytest

from testbed.local_swarm import LocalSwarm, SwarmOptions
from tests.helpers import run_swarm_to_end

pytestmark = pytest.mark.swarm

SMALL = dict(target_samples=96, batch_size=32, subnets=2, width_mult="0.25", head_channels=64)


def test_full_peers_in_two_cohorts_commit_on_certificates_and_agree(tmp_path):
    """Enough rounds that the aggregator's cohort directory (its first epoch comes two ticks after
    the members announced) governs the last ones: every peer plans those from it."""
    rounds = 10
    swarm = LocalSwarm(
        SwarmOptions(peers=3, cohorts=2, rounds=rounds, run_dir=tmp_path, commit="certificates", **SMALL)
    )
    run_swarm_to_end(swarm)
    for i in range(3):
        log = (swarm.peer_dir(i) / "log.txt").read_text()
        assert "rounds commit on certificates" in log
        planned = re.search(
            r"cohort directory epoch \d+: 3 member\(s\) in 2 cohort\(s\), from attempt (\d+)", log
        )
        assert planned, "no round planned from the aggregator's directory"
        assert int(planned.group(1)) <= max(r["attempt"] for r in swarm.rounds(i))
    committed = [{r["round"]: r for r in swarm.rounds(i) if r["committed"]} for i in range(3)]
    assert all(len(c) == rounds for c in committed), [sorted(c) for c in committed]
    for r in range(rounds):
        assert len({c[r]["state_digest"] for c in committed}) == 1, f"peers differ after round {r}"
        assert all(c[r]["contributors"] == 3 for c in committed)
    assert len({c[0]["cohort"] for c in committed}) == 2  # the cross-cohort path: certificates decided
