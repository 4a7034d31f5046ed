"""Does the swarm train as well as one peer? Same task, same samples per round, same rounds.

Runs ``manta-swarm`` four times, one after another, on ``digits``:

    --peers 4 --cohorts 2     data-parallel      (every cohort trains the same K sub-networks)
    --peers 1                 data-parallel      (the reference: one process, the whole sandwich)
    --peers 4 --cohorts 2     model-parallel     (each cohort its share of the sandwich list)
    --peers 1                 model-parallel     (one cohort: the whole sandwich, as data-parallel)

Same samples: a swarm round ends a little past the target (every started mini-batch is finished), so
each single-peer run gets the preceding swarm run's actual mean samples per round as its target.

and prints, per mode, the validation accuracy of the largest and the smallest sub-network of the
single peer and of the swarm side by side with the gap in percentage points (target: <= 1 pp), and
each swarm peer's time split (compute / averaging / other). Every run is a real local swarm (an
aggregator and N peer processes on 127.0.0.1); the summaries are kept under ``--out``.

    python -m benchmarks.swarm_efficiency [--rounds 40] [--target-samples 256] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from testbed.local_swarm import console_script


def run_swarm(out: Path, name: str, peers: int, cohorts: int, mode: str, args, target: int) -> dict:
    run_dir = out / name
    cmd = [
        console_script("manta-swarm"),
        "--peers",
        str(peers),
        "--cohorts",
        str(cohorts),
        "--mode",
        mode,
        "--rounds",
        str(args.rounds),
        "--target-samples",
        str(target),
        "--data-dir",
        str(run_dir),
        "--summary",
        str(out / f"{name}.json"),
    ]
    print(f"== {name}: {' '.join(cmd[1:])}", flush=True)
    started = time.monotonic()
    done = subprocess.run(cmd, env=dict(os.environ, PYTHONUNBUFFERED="1"), text=True)
    if done.returncode != 0:
        sys.exit(f"{name} failed (exit {done.returncode}); logs under {run_dir}")
    summary = json.loads((out / f"{name}.json").read_text())
    print(f"   {time.monotonic() - started:.0f} s", flush=True)
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--target-samples", type=int, default=256)
    parser.add_argument("--modes", default="data,model")
    parser.add_argument(
        "--out", type=Path, default=Path(f"swarm-efficiency-{time.strftime('%Y%m%d-%H%M%S')}")
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    results = {}
    for mode in args.modes.split(","):
        swarm = run_swarm(args.out, f"{mode}-4peers-2cohorts", 4, 2, mode, args, args.target_samples)
        # The swarm's rounds end a little past the target (every started mini-batch is finished); the
        # single peer gets the swarm's actual mean per round, so both runs see the same samples.
        per_round = round(swarm["total_samples"] / max(1, swarm["rounds"]))
        single = run_swarm(args.out, f"{mode}-1peer", 1, 1, mode, args, per_round)
        results[mode] = (single, swarm)
    print()
    print(f"digits, {args.rounds} rounds x {args.target_samples} samples per round (swarm-wide target)")
    header = (
        f"{'mode':<6} {'sub-network':<10} {'1 peer':>8} {'4 peers/2 cohorts':>18} {'gap (pp)':>9}  target"
    )
    print(header)
    print("-" * len(header))
    worst = 0.0
    for mode, (single, swarm) in results.items():
        for which in ("largest", "smallest"):
            a, b = single["accuracy"][which], swarm["accuracy"][which]
            gap = 100 * (a - b)
            worst = max(worst, abs(gap))
            print(f"{mode:<6} {which:<10} {100 * a:>7.2f}% {100 * b:>17.2f}% {gap:>+9.2f}  <= 1 pp")
    print()
    print("samples actually processed (rounds close on the swarm-wide target; mini-batches overshoot it):")
    for mode, (single, swarm) in results.items():
        print(
            f"  {mode}: 1 peer {single['total_samples']} in {single['wall_time_s']:.0f} s, "
            f"4 peers {swarm['total_samples']} in {swarm['wall_time_s']:.0f} s "
            f"(identical final state on every peer: {swarm['identical_final_state']})"
        )
    print()
    print("time split per swarm peer, seconds (compute / averaging incl. matchmaking waits / other):")
    for mode, (_, swarm) in results.items():
        for peer, split in swarm["time_split_s"].items():
            samples = swarm["samples_per_peer"][peer]
            print(
                f"  {mode:<6} {peer}: {split['compute']:7.1f} / {split['averaging']:6.1f} / {split['other']:6.1f}"
                f"   {samples} samples"
            )
    print()
    print(f"largest gap {worst:.2f} pp: {'meets' if worst <= 1.0 else 'MISSES'} the <= 1 pp target")


if __name__ == "__main__":
    main()
