"""How large a swarm of full peers one machine holds under churn: one ``manta-swarm`` run, with its
processes, memory and load sampled beside it.

Runs ``manta-swarm --peers N --churn every:60 --churn-signal kill --time-limit T`` (real ``manta-peer``
processes training on the CPU, one worker each; a peer killed with kill -9 every 60 s and a new one
joining, the churn profile of ``benchmarks/swarm_wan.py``), on 127.0.0.1 or, with ``--sites S``, on the
emulated internet of that profile (50/200 Mbit/s, 40 ms, 0.1 % loss; root and iptables). Every
``--sample-every`` seconds it reads each running peer's process tree (agent, worker, p2pd, the DHT and
averager processes, the reaper): processes, memory (proportional set size: a shared page counts once
over the processes that map it) and the machine's load average, CPU use and free memory.

At the end: the share of peer-rounds committed, rounds, samples and aborts from the run's summary.json.
Near ``--deadline`` the peers and the aggregator still running are killed (kill -9), so that
manta-swarm writes its summary in time; at the deadline everything left is killed. With no
summary.json then, the same round figures come from the peers' own records
(:func:`testbed.figures.peer_figures`).

    python -m benchmarks.swarm_capacity --peers 32 --time-limit 240 [--deadline 330] [--sites 0]
        [--churn every:60] [--cohorts 8] [--out DIR] [--json PATH] [-- more manta-swarm options]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import NoReturn

import psutil

from testbed.local_swarm import console_script

BROADBAND = ["--uplink", "50mbit", "--downlink", "200mbit", "--delay", "40", "--loss", "0.1"]
# Seconds before the deadline at which the peers and the aggregator still running are killed: what
# manta-swarm then needs to evaluate the final state and write its summary.
SUMMARY_SECONDS = 40.0


@dataclass(frozen=True)
class Sample:
    """One look at the machine while the swarm runs."""

    at_s: float
    peer_processes: list[int]  # per running peer: processes in its tree
    peer_mib: list[float]  # per running peer: memory of its tree
    aggregator_mib: float
    load1: float
    cpu_percent: float
    available_mib: float


@dataclass
class Capacity:
    """What the run showed (``--json``)."""

    command: str
    machine: str
    network: str
    peers: int
    time_limit_s: float
    exit_code: int | None
    wall_s: float
    summary_found: bool
    rounds_committed: int = 0
    total_samples: int = 0
    peer_rounds_committed: int = 0
    peer_rounds_aborted: int = 0
    peer_rounds_aborted_leaving: int = 0
    committed_share: float | None = None  # committed / (committed + aborted)
    committed_share_not_leaving: float | None = None  # the aborts of peers leaving at the end left out
    abort_reasons: dict[str, int] = field(default_factory=dict)
    joiners: int = 0
    identical_final_state: bool | None = None
    accuracy: dict[str, float] = field(default_factory=dict)
    samples_taken: int = 0
    peers_running_max: int = 0
    processes_per_peer_median: float | None = None
    processes_per_peer_max: int | None = None
    mib_per_peer_median: float | None = None
    mib_per_peer_max: float | None = None
    mib_all_peers_max: float | None = None
    aggregator_mib_max: float | None = None
    load1_median: float | None = None
    load1_max: float | None = None
    cpu_percent_median: float | None = None
    available_mib_min: float | None = None


def _is_peer(proc: psutil.Process) -> bool:
    try:
        cmd = proc.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False
    return "join" in cmd and any(part.endswith("manta-peer") or "peer.cli" in part for part in cmd)


def _is_aggregator(proc: psutil.Process) -> bool:
    try:
        return any(part.endswith("manta-aggregator") for part in proc.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def _tree_memory(root: psutil.Process) -> tuple[int, float]:
    """(processes, MiB) of ``root`` and its descendants: PSS where readable, else RSS."""
    count, total = 0, 0.0
    try:
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0, 0.0
    for p in procs:
        try:
            try:
                total += p.memory_full_info().pss
            except (psutil.AccessDenied, AttributeError):
                total += p.memory_info().rss
            count += 1
        except psutil.NoSuchProcess:
            pass
    return count, total / 2**20


def take_sample(swarm_pid: int, started: float) -> Sample:
    """Each running peer's tree and the aggregator's, found below the ``manta-swarm`` process."""
    try:
        below = psutil.Process(swarm_pid).children(recursive=True)
    except psutil.NoSuchProcess:
        below = []
    # A peer's forked workers share its agent's command line: a tree's root is a
    # peer (or aggregator) process whose parent is not one.
    peers = {p.pid for p in below if _is_peer(p)}
    aggregators = {p.pid for p in below if _is_aggregator(p)}
    trees, aggregator_mib = [], 0.0
    for p in below:
        try:
            parent = p.ppid()
        except psutil.NoSuchProcess:
            continue
        if p.pid in peers and parent not in peers:
            trees.append(_tree_memory(p))
        elif p.pid in aggregators and parent not in aggregators:
            aggregator_mib += _tree_memory(p)[1]
    return Sample(
        at_s=round(time.monotonic() - started, 1),
        peer_processes=[n for n, _ in trees if n],
        peer_mib=[round(m, 1) for n, m in trees if n],
        aggregator_mib=round(aggregator_mib, 1),
        load1=os.getloadavg()[0],
        cpu_percent=psutil.cpu_percent(interval=None),
        available_mib=round(psutil.virtual_memory().available / 2**20, 1),
    )


def kill_swarm_processes(swarm_pid: int) -> int:
    """kill -9 every process below manta-swarm but its orphan reaper; returns how many."""
    try:
        below = psutil.Process(swarm_pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return 0
    killed = 0
    for p in below:
        try:
            if "hivemind_adapter.reaper" not in p.cmdline():
                p.kill()
                killed += 1
        except psutil.NoSuchProcess:
            pass
    return killed


def add_samples(result: Capacity, samples: list[Sample]) -> None:
    busy = [s for s in samples if s.peer_processes]
    result.samples_taken = len(busy)
    if not busy:
        return
    procs = [n for s in busy for n in s.peer_processes]
    mib = [m for s in busy for m in s.peer_mib]
    result.peers_running_max = max(len(s.peer_processes) for s in busy)
    result.processes_per_peer_median = statistics.median(procs)
    result.processes_per_peer_max = max(procs)
    result.mib_per_peer_median = round(statistics.median(mib), 1)
    result.mib_per_peer_max = round(max(mib), 1)
    result.mib_all_peers_max = round(max(sum(s.peer_mib) for s in busy), 1)
    result.aggregator_mib_max = max(s.aggregator_mib for s in busy)
    result.load1_median = round(statistics.median(s.load1 for s in busy), 2)
    result.load1_max = round(max(s.load1 for s in busy), 2)
    result.cpu_percent_median = round(statistics.median(s.cpu_percent for s in busy), 1)
    result.available_mib_min = min(s.available_mib for s in busy)


def add_rounds(result: Capacity, summary: dict | None, run_dir: Path) -> None:
    """Round figures from summary.json, or (a run cut short) from the peers' own records."""
    if summary is not None:
        swarm = summary["swarm"]
        result.rounds_committed = summary["rounds"]
        result.total_samples = summary["total_samples"]
        result.identical_final_state = summary["identical_final_state"]
        result.accuracy = summary.get("accuracy") or {}
        committed, aborted = swarm["peer_rounds_committed"], swarm["peer_rounds_aborted"]
        leaving = swarm.get("peer_rounds_aborted_leaving", 0)
        result.abort_reasons = dict(list(swarm["abort_reasons"].items())[:5])
        result.joiners = len(swarm["joiners"])
    else:
        from testbed.figures import peer_figures, read_rounds

        peers = peer_figures(run_dir)
        committed = sum(p.rounds_committed for p in peers)
        aborted = sum(p.rounds_aborted for p in peers)
        leaving = sum(p.rounds_aborted_leaving for p in peers)
        records = {p.name: [r for r in read_rounds(run_dir / p.name) if r.get("committed")] for p in peers}
        result.rounds_committed = len({r["round"] for rs in records.values() for r in rs})
        # the peers that left at the end: the state of their last committed round
        last = {
            records[p.name][-1]["state_digest"]
            for p in peers
            if p.ended in ("finished", "stopped") and records[p.name]
        }
        result.identical_final_state = len(last) == 1 if last else None
        result.total_samples = sum(p.samples for p in peers)  # the peers' own samples, summed
        result.joiners = sum(p.joiner for p in peers)
        reasons: dict[str, int] = {}
        for p in peers:
            for reason, n in p.abort_reasons.items():
                reasons[reason] = reasons.get(reason, 0) + n
        result.abort_reasons = dict(sorted(reasons.items(), key=lambda kv: -kv[1])[:5])
    result.peer_rounds_committed, result.peer_rounds_aborted = committed, aborted
    result.peer_rounds_aborted_leaving = leaving
    if committed + aborted:
        result.committed_share = round(committed / (committed + aborted), 4)
    if committed + aborted - leaving:
        result.committed_share_not_leaving = round(committed / (committed + aborted - leaving), 4)


def run(args: argparse.Namespace) -> Capacity:
    """Start manta-swarm, sample until it exits (or the deadline stops it), gather the figures."""
    run_dir = args.out / "run"
    summary_path = args.out / "summary.json"
    network = ["--sites", str(args.sites), *BROADBAND] if args.sites else []
    cmd = [console_script("manta-swarm"), "--peers", str(args.peers), "--cohorts", str(args.cohorts),
           "--rounds", str(args.rounds), "--time-limit", str(args.time_limit), "--churn", args.churn,
           "--churn-signal", "kill", *network, *args.swarm_args, "--data-dir", str(run_dir),
           "--summary", str(summary_path)]  # fmt: skip
    shown = " ".join(["manta-swarm", *map(shlex.quote, cmd[1:])])
    print(f"swarm: {shown}", flush=True)
    started = time.monotonic()
    psutil.cpu_percent(interval=None)  # the first call only starts the count
    proc = subprocess.Popen(cmd, env=dict(os.environ, PYTHONUNBUFFERED="1"), start_new_session=True)
    samples: list[Sample] = []
    forced = False
    next_sample = started + args.sample_every
    while proc.poll() is None:
        time.sleep(0.5)
        now = time.monotonic()
        if now >= next_sample:
            sample = take_sample(proc.pid, started)
            samples.append(sample)
            next_sample = now + args.sample_every
            mib = sum(sample.peer_mib)
            print(
                f"[{sample.at_s:6.0f}s] sample: {len(sample.peer_mib)} peers running, "
                f"{sum(sample.peer_processes)} processes, {mib:.0f} MiB, load {sample.load1:.1f}, "
                f"CPU {sample.cpu_percent:.0f} %, {sample.available_mib:.0f} MiB free",
                flush=True,
            )
        if not forced and now - started > args.deadline - SUMMARY_SECONDS:
            killed = kill_swarm_processes(proc.pid)
            print(
                f"deadline near: kill -9 of {killed} peer and aggregator process(es) still running",
                flush=True,
            )
            forced = True
        if now - started > args.deadline - 5:
            print("deadline reached: killing the swarm's process group", flush=True)
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(10)
    wall = time.monotonic() - started
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else None
    result = Capacity(
        command=shown,
        machine=f"{os.cpu_count()} cores, {psutil.virtual_memory().total / 2**30:.0f} GiB",
        network=f"emulated internet, {args.sites} sites, broadband" if args.sites else "loopback",
        peers=args.peers,
        time_limit_s=args.time_limit,
        exit_code=proc.returncode,
        wall_s=round(wall, 1),
        summary_found=summary is not None,
    )
    add_samples(result, samples)
    add_rounds(result, summary, run_dir)
    return result


def print_result(r: Capacity) -> None:
    print()
    print(f"swarm capacity: {r.peers} full peers, {r.network}, churn, machine {r.machine}")
    print(f"manta-swarm exit {r.exit_code} after {r.wall_s:.0f} s; summary.json: {r.summary_found}")
    share = "-" if r.committed_share is None else f"{100 * r.committed_share:.1f} %"
    share2 = "-" if r.committed_share_not_leaving is None else f"{100 * r.committed_share_not_leaving:.1f} %"
    rows = [
        ("rounds committed / samples", f"{r.rounds_committed} / {r.total_samples}"),
        (
            "peer-rounds committed",
            f"{r.peer_rounds_committed} of {r.peer_rounds_committed + r.peer_rounds_aborted} ({share})",
        ),
        ("  leaving peers' aborts left out", share2),
        ("joiners", str(r.joiners)),
        ("peers running (max seen)", str(r.peers_running_max)),
        ("processes per peer (median / max)", f"{r.processes_per_peer_median} / {r.processes_per_peer_max}"),
        ("MiB per peer, PSS (median / max)", f"{r.mib_per_peer_median} / {r.mib_per_peer_max}"),
        ("MiB all peers (max)", str(r.mib_all_peers_max)),
        ("MiB aggregator (max)", str(r.aggregator_mib_max)),
        ("load average 1 min (median / max)", f"{r.load1_median} / {r.load1_max}"),
        ("CPU use (median)", f"{r.cpu_percent_median} %"),
        ("memory available (min)", f"{r.available_mib_min} MiB"),
        ("identical final state", str(r.identical_final_state)),
        ("accuracy", ", ".join(f"{k} {v:.4f}" for k, v in r.accuracy.items()) or "-"),
    ]
    print("| figure | value |")
    print("|---|---|")
    for name, value in rows:
        print(f"| {name} | {value} |")
    for reason, n in r.abort_reasons.items():
        print(f"  abort: {n}x {reason}")
    print(flush=True)


class OneLineErrorParser(argparse.ArgumentParser):
    """Bad input is one line and exit status 2, without the usage block."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = OneLineErrorParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peers", type=int, default=32)
    parser.add_argument("--cohorts", type=int, default=0, help="0: one cohort per 4 peers")
    parser.add_argument("--time-limit", type=float, default=240, help="manta-swarm --time-limit")
    parser.add_argument("--deadline", type=float, default=0, help="hard stop, s (0: time limit + 150)")
    parser.add_argument("--churn", default="every:60")
    parser.add_argument("--sites", type=int, default=0, help="emulated internet with S sites (0: loopback)")
    parser.add_argument("--rounds", type=int, default=1000, help="rounds of the schedule (the limit ends it)")
    parser.add_argument("--sample-every", type=float, default=10.0)
    parser.add_argument("--out", type=Path, default=Path(f"swarm-capacity-{time.strftime('%Y%m%d-%H%M%S')}"))
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    parser.add_argument("swarm_args", nargs="*", help="more manta-swarm options (after --)")
    args = parser.parse_args(argv)
    if args.peers < 1 or args.time_limit < 1 or args.sample_every <= 0 or args.sites < 0:
        parser.error("--peers, --time-limit and --sample-every must be positive, --sites >= 0")
    args.cohorts = args.cohorts or max(1, args.peers // 4)
    if not 1 <= args.cohorts <= args.peers:
        parser.error(f"--cohorts {args.cohorts} must be in [1, --peers]")
    args.deadline = args.deadline or args.time_limit + 150
    if args.deadline < args.time_limit + SUMMARY_SECONDS + 20:
        parser.error(f"--deadline must leave {SUMMARY_SECONDS + 20:.0f} s after --time-limit")
    if args.out.exists() and any(args.out.iterdir()):
        parser.error(f"--out {args.out} is not empty")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"command: python -m benchmarks.swarm_capacity {' '.join(map(shlex.quote, sys.argv[1:]))}")
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}", flush=True)
    result = run(args)
    print_result(result)
    if args.json is not None:
        args.json.write_text(json.dumps(asdict(result), indent=2) + "\n")


if __name__ == "__main__":
    main()
