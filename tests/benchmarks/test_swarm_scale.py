"""The thin-peer benchmark still runs the real protocol: a small swarm of thin peers commits its
rounds, the commit certificates relayed beside the board commit the board's results, and
certificate rounds planned from the stand-in aggregator's cohort directory commit. (Its thin peers
once declared unsigned matchmaking records that every validator refused, so no group ever formed,
and the benchmark reported 0 % committed for days.)"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.swarm, pytest.mark.slow]


@pytest.mark.skipif(os.geteuid() != 0, reason="the benchmark counts bytes with cgroups and iptables")
def test_four_thin_peers_commit_every_round_and_their_certificates_agree_with_the_board():
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.swarm_scale", "--peers", "4", "--rounds", "3", "--certificates"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    summary = re.search(r"4 peers, k=\d+, nodes, board: median round [\d.]+ s, (\d+)% committed", run.stdout)
    assert summary is not None, run.stdout[-2000:]
    assert int(summary.group(1)) == 100, run.stdout[-2000:]
    beside = re.search(
        r"committed (\d+) of 12 peer-rounds \(the board 100%\), (\d+) on the board's result, (\d+) on another",
        run.stdout,
    )
    assert beside is not None, run.stdout[-2000:]
    assert beside.groups() == ("12", "12", "0"), run.stdout[-2000:]


@pytest.mark.skipif(os.geteuid() != 0, reason="the benchmark counts bytes with cgroups and iptables")
def test_four_thin_peers_commit_every_round_planned_from_the_cohort_directory():
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.swarm_scale", "--peers", "4", "--rounds", "4", "--commit", "certificates",
         "--plan", "directory"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    assert re.search(r"directory epoch \d+: 4 member\(s\)", run.stdout), run.stdout[-2000:]
    summary = re.search(
        r"4 peers, k=\d+, nodes, certificates by directory: median round [\d.]+ s, (\d+)% committed",
        run.stdout,
    )
    assert summary is not None, run.stdout[-2000:]
    assert int(summary.group(1)) == 100, run.stdout[-2000:]
    # only attempt 0, before the first epoch governs, reads the roster (a roster-planned round reads it once)
    roster_reads = re.search(r"'get peers': ([\d.]+)", run.stdout)
    assert roster_reads is not None and float(roster_reads.group(1)) <= 0.3, run.stdout[-2000:]
