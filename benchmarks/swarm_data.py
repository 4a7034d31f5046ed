"""Training data served by the swarm against the same data on every peer's disk, side by side.

A generated 50,000-image folder (real PNG files, ``testbed.image_folder``) is published as an
``imagefolder`` task: the aggregator packs it into content-addressed shards, and 4 peers on the
emulated internet ("broadband": 2 sites of 2 peers, 50 mbit/s up, 200 mbit/s down, 40 ms, 0.1 % loss)
join with the printed line alone. Two runs, the same task, rounds and samples per round:

    swarm     each peer fetches its share of the shards from the swarm (peers, then the aggregator)
    on disk   every shard is already in every peer's cache and each trains on all of them (--whole-dataset)

Printed per run: packing time and the dataset's size, bytes each peer downloaded against the
dataset's size, time from a peer's start to its first training step, wide-area bytes, rounds, wall
time, and the final accuracy of the largest and smallest sub-network; then the command and the load.

    sudo python -m benchmarks.swarm_data [--images 50000] [--peers 4] [--rounds 40]
                                         [--target-samples 256] [--time-limit 1200] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.swarm_wan import profiles
from testbed.image_folder import make_image_folder
from testbed.local_swarm import console_script

RUNS = {"swarm": [], "on disk": ["--whole-dataset"]}
PACKED = re.compile(
    r"packed (\d+) training and (\d+) validation samples into (\d+) shards \(([\d.]+) MB\) in ([\d.]+) s"
)
FIRST_STEP = re.compile(r"data: first training step ([\d.]+) s after the peer started")
FETCHED = re.compile(
    r"data: fetched (\d+) bytes in (\d+) shard\(s\) of a (\d+)-byte dataset; served (\d+) bytes"
)


def _images(args) -> Path:
    folder = args.out / "images"
    marker = folder / ".complete"
    if marker.exists() and marker.read_text() == str(args.images):
        return folder
    print(f"generating {args.images} PNG images in {folder} ...", flush=True)
    started = time.monotonic()
    make_image_folder(folder, args.images, size=32, seed=0)
    marker.write_text(str(args.images))
    print(f"  {time.monotonic() - started:.0f} s", flush=True)
    return folder


def run(name: str, extra: list[str], images: Path, args) -> dict:
    run_dir = args.out / name.replace(" ", "-")
    summary_path = args.out / f"{name.replace(' ', '-')}.json"
    cmd = [console_script("manta-swarm"), "--task", "imagefolder", "--data", str(images),
           "--shard-samples", str(args.shard_samples), "--peers", str(args.peers), "--rounds", str(args.rounds),
           "--target-samples", str(args.target_samples), "--time-limit", str(args.time_limit),
           *profiles(args.peers)["broadband"], *extra, "--data-dir", str(run_dir), "--summary", str(summary_path)]  # fmt: skip
    print(f"\n== {name}: {' '.join(['manta-swarm', *cmd[1:]])}", flush=True)
    load_before = os.getloadavg()
    done = subprocess.run(cmd, env=dict(os.environ, PYTHONUNBUFFERED="1"), text=True)
    if not summary_path.exists():
        print(f"   {name} failed (exit {done.returncode}); logs under {run_dir}", flush=True)
        return {"failed": True}
    summary = json.loads(summary_path.read_text())
    aggregator_log = (run_dir / "aggregator" / "log.txt").read_text()
    packed = PACKED.search(aggregator_log)
    peers = {}
    for log in sorted(run_dir.glob("peer-*/log.txt")):
        text = log.read_text()
        first = FIRST_STEP.search(text)
        fetched = FETCHED.search(text)
        peers[log.parent.name] = {
            "first_step_s": float(first.group(1)) if first else None,
            "fetched": int(fetched.group(1)) if fetched else None,
            "served": int(fetched.group(4)) if fetched else None,
        }
    return {
        "summary": summary,
        "packed": packed.groups() if packed else None,
        "peers": peers,
        "command": " ".join(["manta-swarm", *cmd[1:]]),
        "load": (load_before, os.getloadavg()),
    }


def figures(result: dict) -> dict[str, str]:
    if result.get("failed"):
        return {"rounds committed": "failed"}
    s, peers = result["summary"], result["peers"]
    train, val, shards, mb, seconds = result["packed"] or ("-",) * 5
    dataset = float(mb) * 1e6 if result["packed"] else 0.0
    fetched = [p["fetched"] for p in peers.values() if p["fetched"] is not None]
    firsts = [p["first_step_s"] for p in peers.values() if p["first_step_s"] is not None]
    served = [p["served"] for p in peers.values() if p["served"] is not None]
    quality = s.get("accuracy") or {}
    swarm = s["swarm"]
    return {
        "packing (aggregator)": f"{seconds} s: {train} + {val} samples, {shards} shards, {mb} MB",
        "downloaded per peer": ", ".join(f"{f / 1e6:.1f}" for f in fetched) + " MB" if fetched else "-",
        "  against the dataset": ", ".join(f"{100 * f / dataset:.0f} %" for f in fetched)
        if fetched and dataset
        else "-",
        "served by peers (all)": f"{sum(served) / 1e6:.1f} MB" if served else "-",
        "start to first training step": f"median {statistics.median(firsts):.1f} s, max {max(firsts):.1f} s"
        if firsts
        else "-",
        "wide-area MB sent": f"{swarm['wan_bytes'] / 1e6:.0f}" if "wan_bytes" in swarm else "-",
        "rounds committed": str(s["rounds"]),
        "training samples": str(s["total_samples"]),
        "wall time": f"{s['wall_time_s']:.0f} s",
        "compute utilization": f"{100 * (swarm['compute_utilization'] or 0):.0f} %",
        "accuracy largest": f"{100 * quality['largest']:.2f} %" if "largest" in quality else "-",
        "accuracy smallest": f"{100 * quality['smallest']:.2f} %" if "smallest" in quality else "-",
        "identical final state": str(s["identical_final_state"]),
        "load avg before / after": f"{result['load'][0][0]:.1f} / {result['load'][1][0]:.1f}",
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--images", type=int, default=50_000)
    parser.add_argument("--peers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--target-samples", type=int, default=256)
    parser.add_argument("--shard-samples", type=int, default=500)
    parser.add_argument("--time-limit", type=float, default=1200)
    parser.add_argument("--runs", default="swarm,on disk", help="which runs, comma-separated")
    parser.add_argument("--out", type=Path, default=Path(f"swarm-data-{time.strftime('%Y%m%d-%H%M%S')}"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    names = [n.strip() for n in args.runs.split(",")]
    if unknown := [n for n in names if n not in RUNS]:
        sys.exit(f"unknown run(s) {unknown}; choose from {list(RUNS)}")
    images = _images(args)
    results = {name: run(name, RUNS[name], images, args) for name in names}
    (args.out / "results.json").write_text(json.dumps(results, indent=2, default=str))
    table = {name: figures(result) for name, result in results.items()}
    rows = list(dict.fromkeys(k for t in table.values() for k in t))
    width = max(len(r) for r in rows) + 2
    print("\n" + "".ljust(width) + "".join(n.ljust(44) for n in names))
    for row in rows:
        print(row.ljust(width) + "".join(table[n].get(row, "-").ljust(44) for n in names))
    print(
        f"\n{args.images} images, {args.peers} peers on broadband, {args.rounds} rounds of {args.target_samples} samples"
    )
    print(f"command: sudo {sys.executable} -m benchmarks.swarm_data {' '.join(sys.argv[1:])}")
    print(f"machine: {os.cpu_count()} cores, load now {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
