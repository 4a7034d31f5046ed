"""The run modes read the machine as it is: sysfs power supplies (files in the kernel's format) and
terminals' access times, and a real control socket between two processes' worth of threads."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from peer.control import ControlError, ControlServer, PeerControl, request
from peer.run_policy import RunConditions, RunPolicy, cpu_sample, last_input, on_battery, others_cpu_percent


def _supply(root: Path, name: str, kind: str, online: str | None = None, status: str | None = None) -> None:
    d = root / name
    d.mkdir(parents=True)
    (d / "type").write_text(f"{kind}\n")
    if online is not None:
        (d / "online").write_text(f"{online}\n")
    if status is not None:
        (d / "status").write_text(f"{status}\n")


def test_a_laptop_is_on_battery_only_with_its_adapter_unplugged(tmp_path):
    _supply(tmp_path, "BAT0", "Battery", status="Discharging")
    _supply(tmp_path, "AC", "Mains", online="0")
    assert on_battery(tmp_path)
    (tmp_path / "AC" / "online").write_text("1\n")
    assert not on_battery(tmp_path)
    _supply(tmp_path / "desktop", "AC", "Mains", online="1")  # no battery at all
    assert not on_battery(tmp_path / "desktop")
    assert not on_battery(tmp_path / "no-such-dir")  # a machine without the class


def test_not_on_battery_pauses_while_unplugged(tmp_path):
    _supply(tmp_path, "BAT0", "Battery", status="Discharging")
    _supply(tmp_path, "AC", "Mains", online="0")
    conditions = RunConditions(
        RunPolicy("not-on-battery"), lambda: {os.getpid()}, every=0.1, battery=lambda: on_battery(tmp_path)
    )
    try:
        assert "battery" in (conditions.blocker() or "")
        (tmp_path / "AC" / "online").write_text("1\n")
        _wait_until(lambda: conditions.blocker() is None, "the adapter to be seen")
    finally:
        conditions.stop()


def _wait_until(predicate, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_input_on_a_terminal_keeps_a_when_idle_peer_paused(tmp_path):
    terminal = tmp_path / "pts0"
    terminal.write_text("")
    devices = str(tmp_path / "pts*")
    os.utime(terminal, (time.time(), time.time()))  # someone just typed
    assert abs(last_input(devices, logind=False) - time.time()) < 5
    policy = RunPolicy("when-idle", idle_minutes=0.02, idle_cpu_percent=100.0)  # 1.2 s without input
    conditions = RunConditions(
        policy, lambda: {os.getpid()}, every=0.1, last_input=lambda: last_input(devices, logind=False)
    )
    try:
        assert "in use" in (conditions.blocker() or "")
        _wait_until(lambda: conditions.blocker() is None, "idleness longer than idle_minutes")
        os.utime(terminal, (time.time(), time.time()))  # the user is back
        _wait_until(lambda: "in use" in (conditions.blocker() or ""), "the input to be seen")
    finally:
        conditions.stop()


@pytest.mark.exclusive  # measures CPU shares: nothing else may run beside it
def test_other_processes_cpu_counts_as_use_and_the_peers_own_does_not():
    burner = subprocess.Popen(
        [sys.executable, "-c", "import time\nt = time.time()\nwhile time.time() - t < 30: pass"]
    )
    try:
        time.sleep(0.5)
        mine = {os.getpid(), burner.pid}
        before = cpu_sample(mine)
        time.sleep(1.5)
        as_own = others_cpu_percent(before, cpu_sample(mine))
        before = cpu_sample({os.getpid()})
        time.sleep(1.5)
        as_other = others_cpu_percent(before, cpu_sample({os.getpid()}))
        share = 100.0 / (psutil.cpu_count() or 1)  # one busy core, of the machine
        assert as_other - as_own > 0.5 * share, (as_own, as_other)
    finally:
        burner.kill()
        burner.wait(10)


def test_bad_run_modes_are_refused():
    with pytest.raises(ValueError, match="run mode must be one of"):
        RunPolicy("sometimes")
    with pytest.raises(ValueError, match="idle"):
        RunPolicy("when-idle", idle_cpu_percent=0.0)


def test_the_control_socket_pauses_resumes_and_reports(tmp_path):
    control = PeerControl()
    control.update(state="running", round=3)
    server = ControlServer(tmp_path, control.handle)
    try:
        assert request(tmp_path, "status")["round"] == 3
        assert request(tmp_path, "pause")["paused_by_user"] and control.paused_by_user()
        assert not request(tmp_path, "resume")["paused_by_user"] and not control.paused_by_user()
        with pytest.raises(ControlError, match="another peer is running"):
            ControlServer(tmp_path, control.handle)
    finally:
        server.close()
    assert not (tmp_path / "control.sock").exists()
    with pytest.raises(ControlError, match="no peer is running"):
        request(tmp_path, "status")


def test_a_socket_left_by_a_killed_peer_is_replaced(tmp_path):
    import socket

    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(tmp_path / "control.sock"))
    stale.close()  # the file stays, nobody listens: what kill -9 leaves
    with pytest.raises(ControlError, match="does not answer"):
        request(tmp_path, "status")
    server = ControlServer(tmp_path, PeerControl().handle)
    try:
        assert request(tmp_path, "status")["ok"]
    finally:
        server.close()
