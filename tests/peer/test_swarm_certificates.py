"""A real local swarm whose rounds commit certificates decide (``commit = "certificates"``): three
full peers in two cohorts, every process a real console script on 127.0.0.1."""

from __future__ import annotations

import pytest

from testbed.local_swarm import LocalSwarm, SwarmOptions
from tests.helpers import run_swarm_to_end

pytestmark = pytest.mark.swarm

SMALL = dict(target_samples=96, batch_size=32, subnets=2, width_mult="0.25", head_channels=64)


def test_full_peers_in_two_cohorts_commit_on_certificates_and_agree(tmp_path):
    swarm = LocalSwarm(
        SwarmOptions(peers=3, cohorts=2, rounds=4, run_dir=tmp_path, commit="certificates", **SMALL)
    )
    run_swarm_to_end(swarm)
    for i in range(3):
        assert "rounds commit on certificates" in (swarm.peer_dir(i) / "log.txt").read_text()
    committed = [{r["round"]: r for r in swarm.rounds(i) if r["committed"]} for i in range(3)]
    assert all(len(c) == 4 for c in committed), [sorted(c) for c in committed]
    for r in range(4):
        assert len({c[r]["state_digest"] for c in committed}) == 1, f"peers differ after round {r}"
        assert all(c[r]["contributors"] == 3 for c in committed)
    assert len({c[0]["cohort"] for c in committed}) == 2  # the cross-cohort path: certificates decided
