"""A volunteer's controls on a running peer, as real processes: ``manta-peer pause | resume | status``
through the peer's control socket, and ``--run-mode not-on-battery`` reading power supplies written in
the kernel's sysfs format."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from tests.helpers import console_script
from tests.peer.cli_swarm import Swarm, _env

pytestmark = pytest.mark.swarm


def _control(swarm: Swarm, name: str, command: str) -> dict:
    done = subprocess.run(
        [console_script("manta-peer"), command, "--data-dir", str(swarm.dir / name), "--json"],
        capture_output=True, text=True, timeout=60, env=_env(),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _power(root, on_mains: bool) -> None:
    for name, kind in (("BAT0", "Battery"), ("AC", "Mains")):
        (root / name).mkdir(parents=True, exist_ok=True)
        (root / name / "type").write_text(f"{kind}\n")
    (root / "BAT0" / "status").write_text("Charging\n" if on_mains else "Discharging\n")
    (root / "AC" / "online").write_text("1\n" if on_mains else "0\n")


# Slow (57 s; make test-all): the control socket and the power policy run in test_run_policy; a paused
# peer's CPU in benchmarks/idle_peer.py.
@pytest.mark.slow
def test_a_peer_pauses_and_resumes_on_request_and_on_battery_with_the_same_key(tmp_path):
    power = tmp_path / "power"
    _power(power, on_mains=True)
    swarm = Swarm(tmp_path)
    try:
        peer = swarm.join(
            "laptop", "--run-mode", "not-on-battery", env={"MANTA_POWER_SUPPLY_DIR": str(power)}
        )
        swarm.wait_for(
            lambda: any(r["committed"] for r in swarm.rounds("laptop").values()), 240, "a first commit"
        )
        status = _control(swarm, "laptop", "status")
        assert status["state"] == "running" and status["run_mode"] == "not-on-battery", status
        peer_id = status["peer_id"]

        # The user pauses: the round in progress finishes, then the peer leaves its cohort and waits.
        assert _control(swarm, "laptop", "pause")["paused_by_user"]
        swarm.wait_for(lambda: _control(swarm, "laptop", "status")["state"] == "paused", 120, "the pause")
        assert "pausing: paused by the user" in swarm.log("laptop")
        before = len(swarm.rounds("laptop"))
        time.sleep(4)  # a round takes about 3 s here
        assert len(swarm.rounds("laptop")) == before, "a paused peer went on training"

        # Resumed, it trains again as the same peer, and fetches no state the swarm did not move past.
        _control(swarm, "laptop", "resume")
        swarm.wait_for(lambda: len(swarm.rounds("laptop")) > before, 120, "a round after resuming")
        assert _control(swarm, "laptop", "status")["peer_id"] == peer_id
        after_resume = swarm.log("laptop").split("resumed", 1)[1]
        assert "loaded the swarm's state" not in after_resume

        # Unplugged, it pauses by itself; plugged in again, it goes on.
        _power(power, on_mains=False)
        swarm.wait_for(
            lambda: "battery" in _control(swarm, "laptop", "status").get("reason", ""),
            120,
            "the battery pause",
        )
        before = len(swarm.rounds("laptop"))
        _power(power, on_mains=True)
        swarm.wait_for(lambda: len(swarm.rounds("laptop")) > before, 120, "a round back on mains")
        assert "Traceback" not in swarm.log("laptop")
    finally:
        swarm.stop()
    assert peer.returncode == 0, swarm.log("laptop")[-3000:]
    assert not (tmp_path / "laptop" / "control.sock").exists(), "the control socket outlived its peer"
