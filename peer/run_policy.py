"""When a volunteer's machine lends itself: the run modes of ``manta-peer join --run-mode``.

- ``always``: train whenever the peer runs;
- ``when-idle``: only once nobody has typed on the machine's terminals or its desktop session
  (systemd-logind's idle hint, where there is one) for ``idle_minutes``, and the machine's other
  processes used less than ``idle_cpu_percent`` of its CPU over that time;
- ``not-on-battery``: not while the machine runs on battery.

:class:`RunConditions` samples them from a thread of its own and says why the peer should not
train now (None: it may); the round loop pauses between rounds while it says so.
"""

from __future__ import annotations

import glob
import logging
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil

logger = logging.getLogger("manta.peer")

RUN_MODES = ("always", "when-idle", "not-on-battery")
POWER_SUPPLY_DIR = Path(os.environ.get("MANTA_POWER_SUPPLY_DIR", "/sys/class/power_supply"))
# Terminals whose access time is their last input (a read updates it; output does not).
INPUT_DEVICES = os.environ.get("MANTA_INPUT_DEVICES", "/dev/pts/[0-9]*:/dev/tty[0-9]*")
SAMPLE_SECONDS = 5.0


@dataclass(frozen=True)
class RunPolicy:
    """``mode``: one of :data:`RUN_MODES`; the idle thresholds apply to ``when-idle`` only."""

    mode: str = "always"
    idle_minutes: float = 5.0
    idle_cpu_percent: float = 25.0

    def __post_init__(self) -> None:
        if self.mode not in RUN_MODES:
            raise ValueError(f"run mode must be one of {', '.join(RUN_MODES)}, got {self.mode!r}")
        if not self.idle_minutes >= 0 or not 0 < self.idle_cpu_percent <= 100:
            raise ValueError("idle minutes must be >= 0 and the idle CPU share in (0, 100] %")


def on_battery(power_dir: Path = POWER_SUPPLY_DIR) -> bool:
    """Whether the machine runs on battery: it has a battery and no mains or USB supply online
    (sysfs ``power_supply`` class: each supply's ``type`` and ``online`` files)."""
    batteries, external = 0, False
    for supply in sorted(power_dir.glob("*")) if power_dir.is_dir() else ():
        kind = _read(supply / "type")
        if kind == "Battery":
            batteries += 1
        elif kind in ("Mains", "USB", "USB_C", "USB_PD") and _read(supply / "online") == "1":
            external = True
    return batteries > 0 and not external


def last_input(devices: str = INPUT_DEVICES, logind: bool = True) -> float:
    """Unix time of the newest input on the machine's terminals (``devices``: ``:``-separated globs)
    and, with ``logind``, systemd-logind's desktop sessions (0.0: none seen)."""
    newest = 0.0
    for pattern in devices.split(":"):
        for path in glob.glob(pattern):
            try:
                newest = max(newest, os.stat(path).st_atime)
            except OSError:
                continue
    return max(newest, _logind_last_input()) if logind else newest


class RunConditions:
    """Samples ``policy``'s conditions every ``every`` seconds from a thread until :meth:`stop`.
    ``own_pids`` gives the processes whose CPU is this peer's own (not counted as the machine's
    being busy); ``battery`` and ``last_input`` read the machine (:func:`on_battery`,
    :func:`last_input`)."""

    def __init__(
        self,
        policy: RunPolicy,
        own_pids: Callable[[], set[int]],
        *,
        every: float = SAMPLE_SECONDS,
        battery: Callable[[], bool] = on_battery,
        last_input: Callable[[], float] = last_input,
    ):
        self.policy, self.own_pids, self.every = policy, own_pids, every
        self.battery, self.last_input = battery, last_input
        self._lock = threading.Lock()  # guards _blocker
        self._blocker: str | None = None
        self._busy_at = time.time()  # the last time the machine was in use (input or other CPU)
        self._cpu = cpu_sample(own_pids())
        self._stop = threading.Event()
        self._thread = None
        if policy.mode != "always":
            self._sample()
            self._thread = threading.Thread(target=self._run, name="manta-run-policy", daemon=True)
            self._thread.start()

    def blocker(self) -> str | None:
        """Why the peer should not train now, or None."""
        with self._lock:
            return self._blocker

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            try:
                self._sample()
            except Exception as e:  # a probe that fails once says nothing: keep the last answer
                logger.debug(f"run-mode probe failed: {e}")

    def _sample(self) -> None:
        why = None
        if self.policy.mode == "not-on-battery" and self.battery():
            why = "the machine runs on battery (--run-mode not-on-battery)"
        elif self.policy.mode == "when-idle":
            now = time.time()
            cpu, self._cpu = self._cpu, cpu_sample(self.own_pids())
            others = others_cpu_percent(cpu, self._cpu)
            if others >= self.policy.idle_cpu_percent < 100.0:  # 100: other processes never count
                self._busy_at = now
            self._busy_at = max(self._busy_at, self.last_input())
            idle_for = now - self._busy_at
            if idle_for < 60.0 * self.policy.idle_minutes:
                why = (
                    f"the machine is in use (idle for {idle_for / 60:.1f} of {self.policy.idle_minutes:g} "
                    f"minutes; other processes at {others:.0f} % CPU) (--run-mode when-idle)"
                )
        with self._lock:
            self._blocker = why


@dataclass(frozen=True)
class _CpuSample:
    at: float
    busy: float  # the machine's busy CPU seconds so far
    own: float  # this peer's processes' CPU seconds so far


def cpu_sample(own_pids: set[int]) -> _CpuSample:
    """The machine's busy CPU seconds and those of ``own_pids`` so far."""
    times = psutil.cpu_times()
    busy = sum(times) - times.idle - getattr(times, "iowait", 0.0)
    own = 0.0
    for pid in own_pids:
        try:
            t = psutil.Process(pid).cpu_times()
            own += t.user + t.system
        except psutil.Error:
            continue
    return _CpuSample(time.monotonic(), busy, own)


def others_cpu_percent(before: _CpuSample, after: _CpuSample) -> float:
    """The share of the machine's CPU (all cores) that other processes than the peer's used."""
    elapsed = (after.at - before.at) * (psutil.cpu_count() or 1)
    if elapsed <= 0:
        return 0.0
    return max(0.0, 100.0 * ((after.busy - before.busy) - max(0.0, after.own - before.own)) / elapsed)


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _logind_last_input() -> float:
    """The newest end of idleness systemd-logind reports for a session (0.0: none, or no logind)."""
    if shutil.which("loginctl") is None:
        return 0.0
    try:
        listed = subprocess.run(
            ["loginctl", "list-sessions", "--no-legend"], capture_output=True, text=True, timeout=5
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0.0
    sessions = [line.split()[0] for line in listed.splitlines() if line.split()]
    newest = 0.0
    for session in sessions:
        try:
            out = subprocess.run(
                ["loginctl", "show-session", session, "-p", "IdleHint", "-p", "IdleSinceHint"],
                capture_output=True, text=True, timeout=5,
            ).stdout  # fmt: skip
        except (OSError, subprocess.TimeoutExpired):
            continue
        values = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
        if values.get("IdleHint") == "no":
            return time.time()  # in use now
        since = values.get("IdleSinceHint", "0")
        if since.isdigit():
            newest = max(newest, int(since) / 1e6)
    return newest
