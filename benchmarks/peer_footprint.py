"""What a peer costs its host, at this checkout and at a baseline revision, side by side in one run.

Runs the same local swarm (``manta-swarm --peers N --rounds R`` on the built-in digits task) with the
code of this checkout and with that of ``--baseline`` (checked out into a temporary git worktree with
its own virtual environment, removed afterwards), one after the other, and prints per peer: the OS
processes, the memory (PSS, all of a peer's processes, the median of ``manta-swarm``'s samples), the
seconds from start to the first contribution, the swarm's rounds per minute and its compute share, and
the CPU seconds a peer's agent, workers and ``p2pd`` spend per round (read from ``/proc`` by this
script from the first round every peer reported to the next-to-last, so any revision's swarm is
measured the same way).

    python -m benchmarks.peer_footprint [--baseline e23a904] [--peers 3] [--rounds 8]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]


def _swarm(checkout: Path, peers: int, rounds: int, run_dir: Path) -> dict:
    command = [
        str(checkout / ".venv" / "bin" / "manta-swarm"), "--peers", str(peers), "--rounds", str(rounds),
        "--data-dir", str(run_dir),
    ]  # fmt: skip
    print(f"  $ (cd {checkout}) {' '.join(command[1:])}", flush=True)
    started = time.monotonic()
    with tempfile.TemporaryFile("w+") as out:
        proc = subprocess.Popen(command, cwd=checkout, stdout=out, stderr=subprocess.STDOUT, text=True)
        cpu = _cpu_per_round(proc, run_dir, peers, rounds)
        if proc.wait() != 0:
            out.seek(0)
            sys.exit(f"error: the swarm at {checkout} failed:\n{out.read()[-2000:]}")
    summary = json.loads((run_dir / "summary.json").read_text())
    details = summary["peers_detail"]
    footprint = summary.get("footprint", {})
    return {
        "processes": max((f["processes"] for f in footprint.values()), default=float("nan")),
        "pss_mib": statistics.median(f["pss_mib"] for f in footprint.values()) if footprint else float("nan"),
        "first_contribution_s": statistics.median(d["first_contribution_s"] for d in details),
        "rounds_per_min": summary["rounds"] / (summary["wall_time_s"] / 60),
        "compute": summary["swarm"]["compute_utilization"],
        "committed": summary["swarm"]["peer_rounds_committed"],
        "wall_s": time.monotonic() - started,
        **cpu,
    }


ROLES = ("agent", "workers", "p2pd")


def _rounds_reported(run_dir: Path) -> int:
    return sum(len(f.read_text().splitlines()) for f in run_dir.glob("peer-*/rounds.jsonl") if f.exists())


def _cpu_by_role(swarm: psutil.Process) -> dict[int, tuple[str, float]]:
    """Each peer process's role and CPU seconds so far (the aggregator's are left out)."""
    out = {}
    for proc in swarm.children(recursive=True):
        try:
            command, parent = " ".join(proc.cmdline()), proc.parent()
            times = proc.cpu_times()
            parent_command = " ".join(parent.cmdline()) if parent is not None else ""
        except psutil.Error:
            continue
        if "manta-aggregator" in command or "manta-aggregator" in parent_command:
            continue
        if "p2pd" in command:
            role = "p2pd"
        elif "manta-peer" in command:
            role = "agent" if parent is not None and parent.pid == swarm.pid else "workers"
        else:
            continue  # the reaper and other helpers: a few ms
        out[proc.pid] = (role, times.user + times.system)
    return out


def _cpu_per_round(proc: subprocess.Popen, run_dir: Path, peers: int, rounds: int) -> dict[str, float]:
    """CPU seconds per peer and round, by role, over the rounds reported between two samples: after
    every peer reported its first round, and before the swarm's last (start-up and shutdown left out)."""
    swarm = psutil.Process(proc.pid)
    first = last = None
    while proc.poll() is None:
        done = _rounds_reported(run_dir)
        if first is None and done >= peers:
            first = (done, _cpu_by_role(swarm))
        elif first is not None and done < peers * (rounds - 1):
            last = (done, _cpu_by_role(swarm))
        time.sleep(0.5)
    if first is None or last is None or last[0] <= first[0]:
        return {f"cpu_{role}": float("nan") for role in ROLES}
    peer_rounds = last[0] - first[0]
    spent = dict.fromkeys(ROLES, 0.0)
    for pid, (role, seconds) in last[1].items():
        if pid in first[1]:
            spent[role] += seconds - first[1][pid][1]
    return {f"cpu_{role}": spent[role] / peer_rounds for role in ROLES}


def check_revision(revision: str) -> None:
    """Exit with one line if ``revision`` names no commit of this repository."""
    known = subprocess.run(
        ["git", "rev-parse", "--verify", "--quiet", f"{revision}^{{commit}}"], cwd=ROOT, capture_output=True
    )
    if known.returncode != 0:
        sys.exit(f"error: --baseline {revision}: not a revision of this repository")


def _baseline_checkout(revision: str, into: Path) -> Path:
    subprocess.run(["git", "worktree", "add", "-f", "--detach", str(into), revision], cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL)  # fmt: skip
    subprocess.run(
        ["make", "venv"], cwd=into, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    return into


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default="e23a904", help="git revision to compare with")
    parser.add_argument("--peers", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    check_revision(args.baseline)
    print(f"load average before: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores", flush=True)
    work = Path(tempfile.mkdtemp(prefix="manta-footprint-"))
    try:
        print(f"baseline {args.baseline}:", flush=True)
        baseline = _swarm(
            _baseline_checkout(args.baseline, work / "baseline"), args.peers, args.rounds, work / "b"
        )
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        )
        print(f"this checkout ({head.stdout.strip()}):", flush=True)
        current = _swarm(ROOT, args.peers, args.rounds, work / "c")
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(work / "baseline")], cwd=ROOT,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        shutil.rmtree(work, ignore_errors=True)
    print(f"load average after: {os.getloadavg()[0]:.1f}")
    rows = [
        ("processes per peer", "processes", "{:.0f}"),
        ("memory per peer (PSS, MiB)", "pss_mib", "{:.0f}"),
        ("first contribution (s after start)", "first_contribution_s", "{:.1f}"),
        ("rounds per minute", "rounds_per_min", "{:.2f}"),
        ("compute share", "compute", "{:.0%}"),
        ("CPU s per peer-round: agent", "cpu_agent", "{:.2f}"),
        ("CPU s per peer-round: workers", "cpu_workers", "{:.2f}"),
        ("CPU s per peer-round: p2pd", "cpu_p2pd", "{:.2f}"),
        ("peer-rounds committed", "committed", "{:.0f}"),
    ]
    print(f"\n{'':38}{'baseline':>12}{'this':>12}{'this/baseline':>15}")
    for label, key, fmt in rows:
        b, c = baseline[key], current[key]
        ratio = f"{c / b:.2f}x" if b else "-"
        print(f"{label:38}{fmt.format(b):>12}{fmt.format(c):>12}{ratio:>15}")


if __name__ == "__main__":
    main()
