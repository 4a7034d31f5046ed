"""What a peer costs its host while it trains nothing: a paused peer's CPU, at this checkout and at a
baseline revision, side by side in one run.

For each checkout: an aggregator and ``--peers`` peers (``manta-peer join``, the built-in digits task)
on 127.0.0.1; once every peer committed a round, each is paused (``manta-peer pause``: it leaves its
cohort and waits, connected); after ``--settle`` seconds the CPU time of each peer's whole process tree
is read over ``--seconds`` seconds. Printed per peer: the share of one core, and the processes.

    python -m benchmarks.idle_peer [--baseline e23a904] [--peers 2] [--seconds 30]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from benchmarks.peer_footprint import _baseline_checkout, check_revision

ROOT = Path(__file__).resolve().parents[1]
TASK_TOML = """
[task]
id = "digits-idle"
name = "digits"
[swarm]
target_samples_per_round = 96
batch_size = 32
subnets_per_step = 2
"""
COMMITTED = re.compile(r"round \d+: committed")


def _tree_cpu(pid: int) -> tuple[float, int]:
    """CPU seconds (user and system) of ``pid`` and its live descendants, and how many processes."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0.0, 0
    total, count = 0.0, 0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            t = p.cpu_times()
            total += t.user + t.system
            count += 1
    return total, count


def _wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} within {timeout:.0f} s")
        time.sleep(0.5)


def _idle(checkout: Path, peers: int, settle: float, seconds: float, run_dir: Path) -> dict:
    run_dir.mkdir(parents=True)
    (run_dir / "task.toml").write_text(TASK_TOML)
    bin_dir = checkout / ".venv" / "bin"
    env = dict(os.environ, MANTA_WORKER_THREADS="1", PYTHONUNBUFFERED="1")
    procs: dict[str, subprocess.Popen] = {}

    def spawn(name: str, args: list[str]) -> subprocess.Popen:
        with open(run_dir / f"{name}.out", "w") as out, open(run_dir / f"{name}.err", "w") as err:
            procs[name] = subprocess.Popen(args, stdout=out, stderr=err, env=env, cwd=run_dir)
        return procs[name]

    def log(name: str) -> str:
        return (run_dir / f"{name}.err").read_text()

    try:
        aggregator = spawn("aggregator", [
            str(bin_dir / "manta-aggregator"), "start", "--task", str(run_dir / "task.toml"),
            "--listen", "127.0.0.1:0", "--identity", str(run_dir / "agg.key"), "--data-dir", str(run_dir / "agg"),
        ])  # fmt: skip
        join: list[str] = []

        def join_line() -> bool:
            if aggregator.poll() is not None:
                raise RuntimeError(f"the aggregator ended:\n{log('aggregator')[-2000:]}")
            for line in (run_dir / "aggregator.out").read_text().splitlines():
                if "manta-peer join" in line:
                    join.extend(shlex.split(line)[2:])
                    return True
            return False

        _wait_for(join_line, 120, "join line from the aggregator")
        names = [f"peer{i}" for i in range(peers)]
        for name in names:
            spawn(name, [
                str(bin_dir / "manta-peer"), "join", *join, "--gpus", "none", "--listen", "127.0.0.1:0",
                "--identity", str(run_dir / f"{name}.key"), "--data-dir", str(run_dir / name),
            ])  # fmt: skip
        print(f"    {peers} peer(s) joining; waiting for each one's first commit", flush=True)
        _wait_for(lambda: all(COMMITTED.search(log(n)) for n in names), 300, "commit by every peer")
        for name in names:
            subprocess.run([str(bin_dir / "manta-peer"), "pause", "--data-dir", str(run_dir / name)],
                           check=True, stdout=subprocess.DEVNULL, env=env)  # fmt: skip
        print(f"    paused; settling {settle:.0f} s, then reading CPU for {seconds:.0f} s", flush=True)
        time.sleep(settle)
        before = {n: _tree_cpu(procs[n].pid) for n in names}
        time.sleep(seconds)
        after = {n: _tree_cpu(procs[n].pid) for n in names}
        if any(procs[n].poll() is not None for n in names):
            raise RuntimeError("a peer ended while paused")
        shares = [100.0 * (after[n][0] - before[n][0]) / seconds for n in names]
        return {
            "cpu_percent": statistics.median(shares),
            "cpu_percent_max": max(shares),
            "processes": max(after[n][1] for n in names),
        }
    finally:
        for group in ([n for n in procs if n != "aggregator"], ["aggregator"]):
            for name in group:
                with contextlib.suppress(ProcessLookupError):
                    procs[name].send_signal(signal.SIGTERM)
            for name in group:
                try:
                    procs[name].wait(timeout=60)
                except subprocess.TimeoutExpired:
                    procs[name].kill()
                    procs[name].wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default="e23a904", help="git revision to compare with")
    parser.add_argument("--peers", type=int, default=2)
    parser.add_argument("--settle", type=float, default=15.0)
    parser.add_argument("--seconds", type=float, default=30.0)
    args = parser.parse_args()
    if args.peers < 1 or args.seconds <= 0 or args.settle < 0:
        sys.exit("error: --peers must be at least 1, --seconds positive and --settle not negative")
    check_revision(args.baseline)
    print(f"$ python -m benchmarks.idle_peer --baseline {args.baseline} --peers {args.peers} "
          f"--settle {args.settle:g} --seconds {args.seconds:g}", flush=True)  # fmt: skip
    print(f"load average before: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores", flush=True)
    work = Path(tempfile.mkdtemp(prefix="manta-idle-"))
    try:
        print(f"baseline {args.baseline}:", flush=True)
        checkout = _baseline_checkout(args.baseline, work / "baseline")
        baseline = _idle(checkout, args.peers, args.settle, args.seconds, work / "b")
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        )
        print(f"this checkout ({head.stdout.strip()}):", flush=True)
        current = _idle(ROOT, args.peers, args.settle, args.seconds, work / "c")
    except (RuntimeError, TimeoutError, subprocess.CalledProcessError) as e:
        sys.exit(f"error: {e}")
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(work / "baseline")], cwd=ROOT,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        shutil.rmtree(work, ignore_errors=True)
    print(f"load average after: {os.getloadavg()[0]:.1f}")
    print(f"\n{'a paused peer':<34}{args.baseline:>12}{'this':>12}{'ratio':>8}")
    for key, label in (("cpu_percent", "CPU, % of one core (median)"), ("cpu_percent_max", "CPU, % (most)"),
                       ("processes", "processes")):  # fmt: skip
        b, c = baseline[key], current[key]
        ratio = c / b if b else float("nan")
        print(f"{label:<34}{b:>12.2f}{c:>12.2f}{ratio:>7.2f}x")


if __name__ == "__main__":
    main()
