"""`manta-swarm` on an emulated internet: real peers in two sites (one a home behind NAT with two
client-mode volunteers, who average with each other over their LAN) behind shaped,
delayed links commit rounds together; the summary's wire figures come from the links' counters; and
Ctrl-C leaves no namespace, relay or process behind."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time

import pytest

from testbed.wan.netns import namespaces
from tests.helpers import console_script, needs_emulated_internet, processes_mentioning

pytestmark = [
    pytest.mark.swarm,
    needs_emulated_internet,
]

# a progress line names the newest round any peer committed; it may skip numbers when two rounds
# commit between two polls, so the test waits for "at least round 3", not for the line "round 3"
PROGRESS = re.compile(r"^\[\s*\d+s\] round\s+(\d+)/40")

SMALL = ["--target-samples", "64", "--subnets", "2", "--width-mult", "0.25", "--batch-size", "16"]


# Slow (make test-all; 90-120 s): the default suite checks the NAT itself (test_emulated_internet.py:
# connections go out, none come in, nothing is left after a run), an aggregator and `check` across two
# sites' links (tests/peer/test_reachability_wan.py) and Ctrl-C of a peer (test_join_cli.py).
@pytest.mark.slow
def test_two_sites_one_behind_nat_commit_rounds_and_ctrl_c_removes_everything(tmp_path):
    run = tmp_path / "run"
    before = set(namespaces())
    cmd = [console_script("manta-swarm"), "--sites", "2", "--peers", "4", "--nat", "1", "--uplink", "20mbit",
           "--downlink", "50mbit", "--delay", "10", "--rounds", "40", *SMALL, "--data-dir", str(run)]  # fmt: skip
    # started as a shell starts a background job, with SIGINT ignored: Ctrl-C must still stop the run
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=dict(os.environ, MANTA_WORKER_THREADS="1"),
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))  # fmt: skip
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 420
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            seen = PROGRESS.match(line.strip())
            if seen and int(seen.group(1)) >= 3:
                break
        assert any((m := PROGRESS.match(ln.strip())) and int(m.group(1)) >= 3 for ln in lines), "".join(lines)
        ours = set(namespaces()) - before
        assert len(ours) == 7  # the core, and a LAN and a router for each of the three sites
        proc.send_signal(signal.SIGINT)  # Ctrl-C: peers finish their round and leave
        rest, _ = proc.communicate(timeout=180)
        lines.append(rest)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    out = "".join(lines)
    assert proc.returncode == 0, out[-3000:]
    assert "the emulated internet removed" in out
    assert not set(namespaces()) - before, "the run left namespaces behind"
    assert processes_mentioning(run) == [], "the run left processes behind"

    summary = json.loads((run / "summary.json").read_text())
    assert summary["rounds"] >= 3 and summary["identical_final_state"] is True
    peers = {p["name"]: p for p in summary["peers_detail"]}
    assert {p["site"] for p in peers.values()} == {"site-1", "site-2"}
    assert all(p["rounds_committed"] >= 3 and p["ended"] == "stopped" for p in peers.values()), peers
    assert all(0 < p["compute_utilization"] < 1 for p in peers.values())
    sites = {s["name"]: s for s in summary["sites"]}
    assert sites["site-2"]["nat"] is True and sites["site-1"]["nat"] is False
    # Every site's link carried traffic both ways, counted on the link; some of it was the aggregator's.
    for name in ("aggregator", "site-1", "site-2"):
        assert sites[name]["sent_bytes"] > 100_000 and sites[name]["received_bytes"] > 100_000, sites[name]
    assert sites["site-1"]["to_aggregator_bytes"] > 0 and sites["site-2"]["from_aggregator_bytes"] > 0
    swarm = summary["swarm"]
    assert swarm["wan_bytes"] == sum(s["sent_bytes"] for s in summary["sites"])
    assert swarm["wan_bytes_per_sample"] == round(swarm["wan_bytes"] / summary["total_samples"])
    assert "wide-area" in out and "of which aggregator MB" in out  # the printed tables
