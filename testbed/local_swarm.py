"""A whole swarm on this machine: one ``manta-aggregator`` and N ``manta-peer`` processes on 127.0.0.1.

Every process is started exactly as a user would start it by hand (the installed console scripts,
their own identities, data directories and logs), so what ``manta-swarm`` shows is what a real
deployment does, only on one host. Everything lives under one run directory::

    <run>/task.toml                  the task the aggregator publishes
    <run>/aggregator/                its identity, p2p key, checkpoints/, log
    <run>/peer-<i>/                  each peer's identity, p2p key, rounds.jsonl, final-state.pt, log
    <run>/summary.json               written at the end (see swarm_summary.py)

Stopping: peers leave by themselves after ``rounds`` committed rounds; then the aggregator gets
SIGTERM. Ctrl-C sends SIGTERM to every peer (they finish their round and leave), then to the
aggregator; anything still alive after a grace period is killed, so no process outlives the run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from protocol.logs import get_logger

logger = get_logger("manta.swarm")

GRACE_SECONDS = 60.0  # a peer finishing its round on SIGTERM may need an averaging timeout or two


def console_script(name: str) -> str:
    """The console script ``name`` beside this interpreter (a virtual environment), else on PATH."""
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.exists() else name


@dataclass
class SwarmOptions:
    peers: int
    cohorts: int = 1
    task: str = "digits"
    mode: str = "data"
    rounds: int = 30
    run_dir: Path = Path("manta-run")
    target_samples: int = 256
    batch_size: int = 32
    subnets: int = 4
    learning_rate: str = "0.1"
    width_mult: str = "0.5"
    head_channels: int = 128
    seed: int = 0
    worker_threads: int = 0  # 0: the machine's cores shared among the peers
    extra_toml: str = ""


def task_toml(o: SwarmOptions) -> str:
    """The task file for ``o``: the schedule spans exactly the rounds the peers will run."""
    return (
        f'[task]\nid = "{o.task}-local"\nname = "{o.task}"\nmode = "{o.mode}"\nseed = {o.seed}\n'
        f"[swarm]\ntarget_samples_per_round = {o.target_samples}\nbatch_size = {o.batch_size}\n"
        f'subnets_per_step = {o.subnets}\nlearning_rate = "{o.learning_rate}"\n'
        f'total_rounds = {o.rounds}\nwidth_mult = "{o.width_mult}"\nhead_channels = {o.head_channels}\n'
        f"max_group_size = {max(2, -(-o.peers // o.cohorts))}\n{o.extra_toml}"
    )


class LocalSwarm:
    def __init__(self, options: SwarmOptions):
        self.o = options
        # Absolute: every process runs in this folder, so a relative path would point inside itself.
        self.dir = Path(options.run_dir).resolve()
        self.procs: dict[str, subprocess.Popen] = {}
        self._logs: list = []
        self.started = time.time()

    # ------------------------------------------------------------------ processes

    def _env(self) -> dict:
        threads = self.o.worker_threads or max(1, (os.cpu_count() or 1) // self.o.peers)
        return dict(os.environ, MANTA_WORKER_THREADS=str(threads), PYTHONUNBUFFERED="1")

    def _spawn(self, name: str, args: list[str], folder: Path, env: dict | None = None) -> subprocess.Popen:
        folder.mkdir(parents=True, exist_ok=True)
        log = open(folder / "log.txt", "w")
        self._logs.append(log)
        proc = subprocess.Popen(
            args, stdout=log, stderr=subprocess.STDOUT, env={**self._env(), **(env or {})}, cwd=self.dir
        )
        self.procs[name] = proc
        return proc

    def start_aggregator(
        self, *, resume: bool = False, checkpoint_every: float = 10.0, extra_args: tuple[str, ...] = ()
    ) -> list[str]:
        """Start the aggregator and return the ``manta-peer join`` arguments it prints.

        ``extra_args`` go to ``manta-aggregator start`` as given (e.g. ``("--http", "127.0.0.1:8123")``)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "task.toml").write_text(task_toml(self.o))
        folder = self.dir / "aggregator"
        args = [
            console_script("manta-aggregator"),
            "start",
            "--task",
            str(self.dir / "task.toml"),
            "--listen",
            "127.0.0.1:0",
            "--identity",
            str(folder / "identity.key"),
            "--data-dir",
            str(folder),
            "--checkpoint-every",
            str(checkpoint_every),
        ]
        if resume:
            args.append("--resume")
        args += list(extra_args)
        proc = self._spawn("aggregator", args, folder)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            for line in (folder / "log.txt").read_text().splitlines():
                if line.strip().startswith("manta-peer join"):
                    self.join_args = line.split()[2:]
                    return self.join_args
            if proc.poll() is not None:
                raise RuntimeError(f"the aggregator exited: {_last_line(folder / 'log.txt')}")
            time.sleep(0.2)
        raise RuntimeError("the aggregator printed no join line within 120 s")

    def peer_dir(self, i: int) -> Path:
        return self.dir / f"peer-{i}"

    def start_peer(self, i: int, *extra: str, env: dict | None = None) -> subprocess.Popen:
        folder = self.peer_dir(i)
        args = [
            console_script("manta-peer"),
            "join",
            *self.join_args,
            "--gpus",
            "none",
            "--listen",
            "127.0.0.1:0",
            "--identity",
            str(folder / "identity.key"),
            "--data-dir",
            str(folder),
            "--max-rounds",
            str(self.o.rounds),
        ]
        if self.o.cohorts > 1:
            args += ["--cohort", f"cohort-{i % self.o.cohorts}"]
        return self._spawn(f"peer-{i}", [*args, *extra], folder, env)

    def peer_names(self) -> list[str]:
        return [n for n in self.procs if n.startswith("peer-")]

    def peers_running(self) -> bool:
        return any(self.procs[n].poll() is None for n in self.peer_names())

    def stop(self, names: list[str] | None = None, grace: float = GRACE_SECONDS) -> None:
        """SIGTERM ``names`` (default: peers first, then the aggregator), kill what outlives ``grace``."""
        groups = [names] if names is not None else [self.peer_names(), ["aggregator"]]
        for group in groups:
            live = [self.procs[n] for n in group if n in self.procs and self.procs[n].poll() is None]
            for proc in live:
                proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + grace
            for proc in live:
                try:
                    proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(10)

    def close(self) -> None:
        self.stop(grace=5.0)
        for log in self._logs:
            log.close()

    # ------------------------------------------------------------------ what the peers report

    def rounds(self, i: int) -> list[dict]:
        path = self.peer_dir(i) / "rounds.jsonl"
        if not path.exists():
            return []
        out = []
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                pass  # a line being written
        return out


def _last_line(path: Path) -> str:
    lines = [ln for ln in path.read_text().splitlines() if ln.strip()] if path.exists() else []
    return lines[-1] if lines else "(no output)"
