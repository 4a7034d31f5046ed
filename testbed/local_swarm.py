"""A whole swarm on this machine: one ``manta-aggregator`` and N ``manta-peer`` processes, on
127.0.0.1 or in the sites of an emulated internet (:mod:`testbed.wan`).

Every process is started exactly as a user would start it by hand (the installed console scripts,
their own identities, data directories and logs), so what ``manta-swarm`` shows is what a real
deployment does. Everything lives under one run directory::

    <run>/task.toml                  the task the aggregator publishes
    <run>/aggregator/                its identity, p2p key, checkpoints/, log
    <run>/peer-<i>/                  each peer's identity, p2p key, rounds.jsonl, final-state.pt, log
    <run>/processes.jsonl            every start, signal and exit, with its time and site
    <run>/links/                     the emulated links' relay counters (with --sites)
    <run>/summary.json               written at the end (see summary.py)

With an emulated internet, the aggregator runs in its own site and each peer in its site's LAN,
bound to the site's address. A peer in a NAT site is started as any other: it finds by itself that
nobody can connect to it (a dial-back, peer/reachability.py) and runs in client mode.

Stopping: peers leave by themselves at the run's end; then the aggregator gets SIGTERM. Ctrl-C sends
SIGTERM to every peer (they finish their round and leave), then to the aggregator; anything still
alive after a grace period is killed, so no process outlives the run.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from testbed.wan.topology import AGGREGATOR_SITE, EmulatedInternet

logger = logging.getLogger("manta.swarm")

GRACE_SECONDS = 60.0  # a peer finishing its round on SIGTERM may need an averaging timeout or two
# The aggregator's shutdown closes its last rounds (at most 30 s), runs the audits it already chose
# (at most 120 s) and writes a last checkpoint (at most 20 s), so that no receipt it accepted goes
# unaudited, the run's last state is kept and its socket files are removed.
AGGREGATOR_GRACE_SECONDS = 180.0
LOOPBACK = "127.0.0.1"


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
    # how cohorts synchronise (protocol.task_spec.SwarmParams): "every-step", or "outer" steps
    sync: str = "every-step"
    inner_steps: int = 5
    outer_lr: str = "1.0"
    outer_momentum: str = "0.0"
    outer_compression: str = "int8"
    outer_overlap: bool = True
    commit: str = "board"  # what decides a round: "board" or "certificates" (SwarmParams.commit)
    # False: each peer runs `rounds` committed rounds of its own (--max-rounds); True: every peer,
    # joiners included, leaves once the swarm has committed `rounds` rounds (--until-round).
    until_swarm_round: bool = False
    # a task on an operator's dataset: the folder the aggregator packs ([data] path) and its layout
    data_path: str = ""
    data_layout: str = ""
    shard_samples: int = 500
    whole_dataset: bool = False  # every peer trains on every shard (the data-on-every-disk baseline)


def task_toml(o: SwarmOptions) -> str:
    """The task file for ``o``: the schedule spans exactly the rounds the peers will run."""
    return (
        f'[task]\nid = "{o.task}-local"\nname = "{o.task}"\nmode = "{o.mode}"\nseed = {o.seed}\n'
        f"[swarm]\ntarget_samples_per_round = {o.target_samples}\nbatch_size = {o.batch_size}\n"
        f'subnets_per_step = {o.subnets}\nlearning_rate = "{o.learning_rate}"\n'
        f'total_rounds = {o.rounds}\nwidth_mult = "{o.width_mult}"\nhead_channels = {o.head_channels}\n'
        f"max_group_size = {max(2, -(-o.peers // o.cohorts))}\n{_sync_toml(o)}{o.extra_toml}"
        f"{_data_toml(o)}"
        # every local peer connects from one network: admit them all (and those a churn restarts)
        f"\n[membership]\nper_network_per_hour = {max(16, 4 * o.peers)}\n"
    )


def _data_toml(o: SwarmOptions) -> str:
    if not o.data_path:
        return ""
    layout = f'layout = "{o.data_layout}"\n' if o.data_layout else ""
    return f"\n[data]\npath = {json.dumps(str(Path(o.data_path).resolve()))}\n{layout}shard_samples = {o.shard_samples}\n"


def _sync_toml(o: SwarmOptions) -> str:
    commit = f'commit = "{o.commit}"\n' if o.commit != "board" else ""
    if o.sync == "every-step":
        return commit
    return commit + (
        f'sync = "{o.sync}"\ninner_steps = {o.inner_steps}\nouter_lr = "{o.outer_lr}"\n'
        f'outer_momentum = "{o.outer_momentum}"\nouter_compression = "{o.outer_compression}"\n'
        f"outer_overlap = {'true' if o.outer_overlap else 'false'}\n"
    )


Signal = Literal["kill", "int", "term"]
_SIGNALS = {"kill": signal.SIGKILL, "int": signal.SIGINT, "term": signal.SIGTERM}


class LocalSwarm:
    def __init__(
        self,
        options: SwarmOptions,
        internet: EmulatedInternet | None = None,
        placement: list[str] | None = None,
    ):
        """``placement[i]`` is the site of peer i (needed with ``internet``)."""
        self.o = options
        # Absolute: every process runs in this folder, so a relative path would point inside itself.
        self.dir = Path(options.run_dir).resolve()
        self.internet = internet
        self.placement = list(placement or [])
        self.procs: dict[str, subprocess.Popen] = {}
        self.sites: dict[str, str | None] = {}
        self.started_at: dict[str, float] = {}
        self._logs: list = []
        self._exits_recorded: set[str] = set()
        self.signalled: dict[str, set[str]] = {}  # process name -> the signals sent to it ("term", ...)
        self.started = time.time()

    # ------------------------------------------------------------------ processes

    def _env(self) -> dict:
        threads = self.o.worker_threads or max(1, (os.cpu_count() or 1) // self.o.peers)
        return dict(os.environ, MANTA_WORKER_THREADS=str(threads), PYTHONUNBUFFERED="1")

    def _address(self, site: str | None) -> str:
        return LOOPBACK if site is None else self.internet.sites[site].address

    def _event(self, name: str, event: str, **extra) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        record = {"name": name, "event": event, "time": time.time(), "site": self.sites.get(name), **extra}
        with open(self.dir / "processes.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")

    def _spawn(
        self, name: str, args: list[str], folder: Path, env: dict | None = None, site: str | None = None
    ) -> subprocess.Popen:
        folder.mkdir(parents=True, exist_ok=True)
        log = open(folder / "log.txt", "w")
        self._logs.append(log)
        kwargs = dict(stdout=log, stderr=subprocess.STDOUT, env={**self._env(), **(env or {})}, cwd=self.dir)
        if site is not None:
            proc = self.internet.popen(site, args, **kwargs)
        else:
            proc = subprocess.Popen(args, **kwargs)
        self.procs[name] = proc
        self.sites[name] = site
        self.started_at[name] = time.time()
        self._exits_recorded.discard(name)
        self._event(name, "start", pid=proc.pid)
        return proc

    def start_aggregator(
        self, *, resume: bool = False, checkpoint_every: float = 10.0, extra_args: tuple[str, ...] = ()
    ) -> list[str]:
        """Start the aggregator and return the ``manta-peer join`` arguments it prints.

        ``extra_args`` go to ``manta-aggregator start`` as given (e.g. ``("--http", "127.0.0.1:8123")``)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "task.toml").write_text(task_toml(self.o))
        folder = self.dir / "aggregator"
        site = AGGREGATOR_SITE if self.internet is not None else None
        args = [
            console_script("manta-aggregator"),
            "start",
            "--task",
            str(self.dir / "task.toml"),
            "--listen",
            f"{self._address(site)}:0",
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
        proc = self._spawn("aggregator", args, folder, site=site)
        # packing an operator's dataset (decoding every image once) comes before the join line
        wait = 1800 if self.o.data_path else 120
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            for line in (folder / "log.txt").read_text().splitlines():
                if line.strip().startswith("manta-peer join"):
                    self.join_args = shlex.split(line)[2:]  # the line is quoted as a shell reads it
                    return self.join_args
            if proc.poll() is not None:
                raise RuntimeError(f"the aggregator exited: {_last_line(folder / 'log.txt')}")
            time.sleep(0.2)
        raise RuntimeError(f"the aggregator printed no join line within {wait} s")

    def peer_dir(self, i: int) -> Path:
        return self.dir / f"peer-{i}"

    def site_of(self, i: int) -> str | None:
        if self.internet is None:
            return None
        if i < len(self.placement):
            return self.placement[i]
        raise ValueError(f"peer-{i} has no site; pass site= to start_peer")

    def start_peer(
        self,
        i: int,
        *extra: str,
        env: dict | None = None,
        site: str | None = None,
        command: list[str] | None = None,
    ) -> subprocess.Popen:
        """Start peer ``i`` with ``manta-peer join`` (or ``command`` in its place, given the same
        arguments: the test suite's dishonest peers)."""
        folder = self.peer_dir(i)
        if self.internet is not None:
            site = site or self.site_of(i)
            while len(self.placement) <= i:
                self.placement.append(site)
            self.placement[i] = site
        args = [
            *(command or [console_script("manta-peer")]),
            "join",
            *self.join_args,
            "--gpus",
            "none",
            "--listen",
            f"{self._address(site)}:0",
            "--identity",
            str(folder / "identity.key"),
            "--data-dir",
            str(folder),
            "--until-round" if self.o.until_swarm_round else "--max-rounds",
            str(self.o.rounds),
        ]
        if self.o.cohorts > 1:
            args += ["--cohort", f"cohort-{i % self.o.cohorts}"]
        if self.o.whole_dataset:
            args.append("--whole-dataset")
            # the data already on this peer's disk: every shard the aggregator packed, in its cache
            shards = folder / "data" / "shards"
            shards.mkdir(parents=True, exist_ok=True)
            for packed in (self.dir / "aggregator" / "data" / "shards").glob("*.shard"):
                if not (shards / packed.name).exists():
                    shutil.copyfile(packed, shards / packed.name)
        return self._spawn(f"peer-{i}", [*args, *extra], folder, env, site=site)

    def signal_peer(self, name: str, how: Signal) -> None:
        """Send ``how`` (kill: kill -9; int: Ctrl-C; term: SIGTERM) to a process (a peer's agent)."""
        proc = self.procs[name]
        if proc.poll() is None:
            proc.send_signal(_SIGNALS[how])
            self.signalled.setdefault(name, set()).add(how)
            self._event(name, f"signal-{how}")

    def peer_names(self) -> list[str]:
        return [n for n in self.procs if n.startswith("peer-")]

    def running_peers(self) -> list[str]:
        return [n for n in self.peer_names() if self.procs[n].poll() is None]

    def peers_running(self) -> bool:
        return bool(self.running_peers())

    def record_exits(self) -> None:
        """Log the exit of every process that has ended since the last call."""
        for name, proc in self.procs.items():
            if proc.poll() is not None and name not in self._exits_recorded:
                self._exits_recorded.add(name)
                self._event(name, "exit", returncode=proc.returncode)

    def stop(self, names: list[str] | None = None, grace: float = GRACE_SECONDS) -> None:
        """SIGTERM ``names`` (default: peers first, then the aggregator), kill what outlives ``grace``."""
        groups = [names] if names is not None else [self.peer_names(), ["aggregator"]]
        for group in groups:
            names_live = [n for n in group if n in self.procs and self.procs[n].poll() is None]
            live = [self.procs[n] for n in names_live]
            for name in names_live:
                self.signal_peer(name, "term")
            deadline = time.monotonic() + grace
            for proc in live:
                try:
                    proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(10)
        self.record_exits()

    def close(self) -> None:
        """Stop what is still running: peers get 5 s (normally they have left), the aggregator its
        bounded shutdown (:data:`AGGREGATOR_GRACE_SECONDS`)."""
        self.stop(self.peer_names(), grace=5.0)
        self.stop(["aggregator"], grace=AGGREGATOR_GRACE_SECONDS)
        for log in self._logs:
            log.close()

    # ------------------------------------------------------------------ what the peers report

    def rounds(self, i: int | str) -> list[dict]:
        folder = self.dir / i if isinstance(i, str) else self.peer_dir(i)
        path = folder / "rounds.jsonl"
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
