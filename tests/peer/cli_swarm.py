"""A swarm of real console-script processes on 127.0.0.1 (an aggregator and ``manta-peer join`` peers),
for the tests that drive the commands as a user does."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import time
from pathlib import Path

from tests.helpers import console_script

TASK_TOML = """
[task]
id = "digits-cli-test"
name = "digits"
[swarm]
target_samples_per_round = 96
batch_size = 32
subnets_per_step = 2
"""
ROUND_RE = re.compile(
    r"round (\d+): (committed|aborted), loss ([\d.]+), (\d+) samples in [\d.]+ s, (\d+) contributor\(s\), "
    r"cohort (\S+), state ([0-9a-f]{12})"
)


def _env() -> dict:
    return dict(os.environ, MANTA_WORKER_THREADS="1", MANTA_LOG_LEVEL="INFO", PYTHONUNBUFFERED="1")


class Swarm:
    """An aggregator plus peers, each a real console-script process; everything is stopped at the end."""

    def __init__(self, tmp_path: Path, task_toml: str = TASK_TOML):
        self.dir = tmp_path
        (tmp_path / "task.toml").write_text(task_toml)
        self.procs: dict[str, subprocess.Popen] = {}
        agg = self._spawn(
            "aggregator",
            [
                console_script("manta-aggregator"),
                "start",
                "--task",
                str(tmp_path / "task.toml"),
                "--listen",
                "127.0.0.1:0",
                "--identity",
                str(tmp_path / "agg.key"),
                "--data-dir",
                str(tmp_path / "agg"),
                "--refresh",
                "5",
            ],
        )
        self.join_args = self._wait_for_join_line(agg)

    def _spawn(self, name: str, args: list[str], env: dict | None = None) -> subprocess.Popen:
        out = open(self.dir / f"{name}.out", "w")
        err = open(self.dir / f"{name}.err", "w")
        proc = subprocess.Popen(args, stdout=out, stderr=err, env={**_env(), **(env or {})}, cwd=self.dir)
        self.procs[name] = proc
        return proc

    def _wait_for_join_line(self, agg: subprocess.Popen, timeout: float = 60) -> list[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in (self.dir / "aggregator.out").read_text().splitlines():
                if "manta-peer join" in line:
                    return shlex.split(line)[2:]  # as a shell reads it; drop "manta-peer join"
            assert agg.poll() is None, (self.dir / "aggregator.err").read_text()
            time.sleep(0.2)
        raise AssertionError("the aggregator printed no join line")

    def join(self, name: str, *extra: str, env: dict | None = None) -> subprocess.Popen:
        return self._spawn(
            name,
            [
                console_script("manta-peer"),
                "join",
                *self.join_args,
                "--gpus",
                "none",
                "--listen",
                "127.0.0.1:0",
                "--identity",
                str(self.dir / f"{name}.key"),
                "--data-dir",
                str(self.dir / name),
                *extra,
            ],
            env,
        )

    def log(self, name: str) -> str:
        return (self.dir / f"{name}.err").read_text()

    def rounds(self, name: str) -> dict[int, dict]:
        out = {}
        for m in ROUND_RE.finditer(self.log(name)):
            out[int(m.group(1))] = dict(
                committed=m.group(2) == "committed",
                contributors=int(m.group(5)),
                cohort=m.group(6),
                digest=m.group(7),
            )
        return out

    def wait_for(self, predicate, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}")
            time.sleep(0.5)

    def peer_exit_code(self, name: str, timeout: float) -> int:
        """Peer ``name``'s exit code once it ended within ``timeout`` s; else an AssertionError with the
        end of its log and where each of its threads was (``manta-peer join`` prints that on SIGUSR1)."""
        try:
            return self.procs[name].wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.procs[name].send_signal(signal.SIGUSR1)
            time.sleep(2.0)
            raise AssertionError(
                f"{name} did not exit within {timeout:.0f} s:\n{self.log(name)[-8000:]}"
            ) from None

    def stop(self) -> None:
        """Peers first, then the aggregator, as an operator would: a leaving peer delivers its last
        receipts to the aggregator instead of retrying an aggregator that is gone."""
        peers = [n for n in self.procs if n != "aggregator"]
        for group in (peers, ["aggregator"]):
            for name in group:
                if self.procs[name].poll() is None:
                    self.procs[name].send_signal(signal.SIGTERM)
            for name in group:
                try:
                    self.procs[name].wait(timeout=30)
                except subprocess.TimeoutExpired:
                    self.procs[name].kill()
                    self.procs[name].wait(5)
