"""`manta-swarm` tells its caller when a peer failed: a non-zero exit and one line naming the peer."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from tests.helpers import console_script, wait_until

pytestmark = [pytest.mark.swarm, pytest.mark.slow]  # a whole manta-swarm run (about 45 s): `make test-all`


def _started_pid(events: str, name: str) -> int | None:
    try:
        lines = open(events).read().splitlines()
    except FileNotFoundError:
        return None
    starts = [json.loads(line) for line in lines if line.strip()]
    return next((e["pid"] for e in starts if e.get("name") == name and e.get("event") == "start"), None)


def test_a_peer_that_crashes_makes_manta_swarm_fail_in_one_line(tmp_path):
    # peer-1's agent crashes as it starts (SIGSEGV, as a native library's fault would end it) and
    # peer-0 trains on alone: whatever peer-0 committed, the run is not a success, and a script that
    # drives manta-swarm must be able to tell (the churn's own kills are not failures).
    run = tmp_path / "run"
    swarm = subprocess.Popen(
        [
            console_script("manta-swarm"),
            *"--peers 2 --rounds 2 --target-samples 64 --subnets 1 --width-mult 0.25".split(),
            *("--data-dir", str(run), "--summary", str(tmp_path / "summary.json")),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, MANTA_WORKER_THREADS="1"),
    )
    try:
        wait_until(lambda: _started_pid(str(run / "processes.jsonl"), "peer-1"), 120, "peer-1 to start")
        os.kill(_started_pid(str(run / "processes.jsonl"), "peer-1"), signal.SIGSEGV)
        out, err = swarm.communicate(timeout=600)
    finally:
        if swarm.poll() is None:
            swarm.send_signal(signal.SIGINT)  # manta-swarm removes what it started
            swarm.communicate(timeout=120)
    sys.stdout.write(out)
    assert swarm.returncode == 1, (swarm.returncode, err[-2000:])
    assert "Traceback" not in err, err[-2000:]
    errors = [line for line in err.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "peer(s) peer-1 exited with an error" in errors[0], err[-2000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["failed_peers"] == ["peer-1"]
    assert summary["rounds"] >= 1, "peer-0 trained on without it"
