"""The swarm on an emulated internet: five network profiles in one run, their figures side by side.

Each profile is one real ``manta-swarm`` run (an aggregator and N peer processes; with ``--sites``
every site is a network namespace behind a shaped, delayed, lossy access link, see testbed/wan/):

    loopback         --peers 8 --cohorts 4                       manta-swarm on 127.0.0.1
    lan              --sites 4 (2 peers each), 1gbit both ways, 0.5 ms
    broadband        --sites 4 (2 peers each), 50mbit up / 200mbit down, 40 ms, 0.1 % loss
    home             --sites 8 (1 peer each), 20mbit up / 100mbit down, 80 ms, 0.5 % loss, 2 behind NAT
    broadband-churn  broadband, and a peer killed with kill -9 every 60 s and a new one joining

(``--delay`` is each site's one-way delay to the internet core, so two sites are twice that apart.)
Every profile trains the same task for the same rounds and target samples per round. Printed per
profile: rounds committed, samples, wall time, median round time, compute utilization and the split
of in-round time by stage, aborted peer-rounds and their main reasons, wide-area bytes (counted by
the kernel on each site's access link) in total, exchanged with the aggregator, and per training
sample, the joiners' time to their first committed contribution, the final accuracy of the largest
and smallest sub-network, whether the peers that finished hold one state, and the machine's load.

    sudo python -m benchmarks.swarm_wan [--peers 8] [--rounds 30] [--profiles loopback,lan,...]
                                        [--time-limit 900] [--out DIR]
                                        [--sync every-step,outer] [--inner-steps 5]
                                        [--outer-compression int8] [--outer-lr 1.0] [--outer-momentum 0]
                                        [--no-outer-overlap]

``--sync every-step,outer`` runs every profile once per synchronisation mode, side by side at equal
rounds and target samples (so equal training samples), and adds each outer column's wide-area bytes
per sample against its every-step column's ("WAN bytes / sample vs every-step").

``--peers 4`` halves the sites (2 x 2; home 4 x 1 with 1 behind NAT). Needs root (network
namespaces) and iptables; each profile is bounded by ``--time-limit`` seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from testbed.local_swarm import console_script


def profiles(peers: int) -> dict[str, list[str]]:
    """The five profiles for ``peers`` peers: at 8, 4 x 2 and 8 x 1 with 2 NAT;
    at 4, half as many (2 x 2, 4 x 1 with 1 NAT)."""
    broadband = ["--sites", str(peers // 2), "--uplink", "50mbit", "--downlink", "200mbit", "--delay", "40",
                 "--loss", "0.1"]  # fmt: skip
    return {
        "loopback": ["--cohorts", str(peers // 2)],
        "lan": ["--sites", str(peers // 2), "--uplink", "1gbit", "--downlink", "1gbit", "--delay", "0.5"],
        "broadband": broadband,
        "home": [
            "--sites",
            str(peers),
            "--uplink",
            "20mbit",
            "--downlink",
            "100mbit",
            "--delay",
            "80",
            "--loss",
            "0.5",
            "--nat",
            str(max(1, peers // 4)),
        ],  # fmt: skip
        "broadband-churn": [*broadband, "--churn", "every:60", "--churn-signal", "kill"],
    }


def sync_args(sync: str, args) -> list[str]:
    """The manta-swarm options of one synchronisation mode."""
    if sync == "every-step":
        return []
    return ["--sync", sync, "--inner-steps", str(args.inner_steps), "--outer-compression",
            args.outer_compression, "--outer-lr", args.outer_lr, "--outer-momentum", args.outer_momentum,
            "--outer-overlap" if args.outer_overlap else "--no-outer-overlap"]  # fmt: skip


def run_profile(name: str, extra: list[str], args) -> dict:
    run_dir = args.out / name
    cmd = [console_script("manta-swarm"), "--peers", str(args.peers), "--rounds", str(args.rounds),
           "--target-samples", str(args.target_samples), "--time-limit", str(args.time_limit), *extra,
           *args.swarm_args, "--data-dir", str(run_dir), "--summary", str(args.out / f"{name}.json")]  # fmt: skip
    print(f"\n== {name}: {' '.join(['manta-swarm', *cmd[1:]])}", flush=True)
    load_before = os.getloadavg()
    started = time.monotonic()
    done = subprocess.run(cmd, env=dict(os.environ, PYTHONUNBUFFERED="1"), text=True)
    wall = time.monotonic() - started
    if not (args.out / f"{name}.json").exists():  # exit 1 with a summary: it ran, and committed nothing
        print(f"   {name} failed (exit {done.returncode}); logs under {run_dir}", flush=True)
        return {"failed": True, "command": cmd}
    summary = json.loads((args.out / f"{name}.json").read_text())
    summary["bench"] = {"command": " ".join(["manta-swarm", *cmd[1:]]), "wall_s": round(wall, 1),
                        "load_before": load_before, "load_after": os.getloadavg()}  # fmt: skip
    (args.out / f"{name}.json").write_text(json.dumps(summary, indent=2))
    return summary


def _round_times(run_dir: Path) -> list[float]:
    """Median over peers of each committed round's duration (end to end, as the peers report it)."""
    by_round: dict[int, list[float]] = {}
    for rounds in run_dir.glob("peer-*/rounds.jsonl"):
        for line in rounds.read_text().splitlines():
            r = json.loads(line)
            if r.get("committed"):
                by_round.setdefault(r["round"], []).append(r["seconds"])
    return [statistics.median(v) for _, v in sorted(by_round.items())]


def _joiners_within(swarm: dict, seconds: float) -> str:
    """Of the joiners that ran at least ``seconds`` (churn kills some sooner), how many had a committed
    contribution within ``seconds`` of their start."""
    lived = swarm.get("joiners_lived_s", {})
    ran = [name for name, s in lived.items() if s is None or s >= seconds]
    if not ran:
        return "-"
    within = [n for n in ran if (swarm["joiners"].get(n) or float("inf")) <= seconds]
    return f"{len(within)} of {len(ran)}"


def figures(summary: dict, run_dir: Path) -> dict[str, str]:
    if summary.get("failed"):
        return {"rounds committed": "failed"}
    swarm = summary["swarm"]
    stages = swarm["stages_s"]
    total = sum(stages.values()) or 1.0
    rounds = _round_times(run_dir)
    quality = summary.get("accuracy") or {}
    epe = summary.get("epe") or {}
    joiners = [v for v in swarm["joiners"].values() if v is not None]
    out = {
        "rounds committed": f"{summary['rounds']}",
        "training samples": f"{summary['total_samples']}",
        "wall time": f"{summary['wall_time_s']:.0f} s",
        "round time (median)": f"{statistics.median(rounds):.1f} s" if rounds else "-",
        "compute utilization": f"{100 * (swarm['compute_utilization'] or 0):.0f} %",
        "in-round time: compute": f"{100 * stages['compute'] / total:.0f} %",
        "  cohort stage": f"{100 * stages['cohort'] / total:.0f} %",
        "  cross stage": f"{100 * stages['cross'] / total:.0f} %",
        "  broadcast": f"{100 * stages['broadcast'] / total:.0f} %",
        "  commit": f"{100 * stages['commit'] / total:.0f} %",
        "  roster read": f"{100 * stages.get('roster', 0.0) / total:.0f} %",
        "  gradient digest and sketch": f"{100 * stages.get('commitments', 0.0) / total:.0f} %",
        "  optimizer step": f"{100 * stages.get('apply', 0.0) / total:.0f} %",
        "  receipt, state served": f"{100 * stages.get('publish', 0.0) / total:.0f} %",
        "  other": f"{100 * stages['other'] / total:.0f} %",
        "  between rounds": f"{100 * stages.get('between', 0.0) / total:.0f} %",
        "aborted peer-rounds": f"{swarm['peer_rounds_aborted']} of "
        f"{swarm['peer_rounds_aborted'] + swarm['peer_rounds_committed']}",
        "  of which while leaving": str(swarm.get("peer_rounds_aborted_leaving", 0)),
        "committed late": str(swarm.get("peer_rounds_committed_late", 0)),
        "wide-area MB sent": f"{swarm['wan_bytes'] / 1e6:.0f}" if "wan_bytes" in swarm else "-",
        "  with the aggregator": f"{100 * swarm['wan_bytes_with_aggregator'] / max(1, swarm['wan_bytes']):.0f} %"
        if "wan_bytes" in swarm
        else "-",
        "wide-area KB / sample": f"{swarm['wan_bytes_per_sample'] / 1e3:.1f}"
        if swarm.get("wan_bytes_per_sample")
        else "-",
        "  between peer sites (no aggregator)": f"{swarm['wan_bytes_between_peer_sites'] / 1e6:.0f}"
        if "wan_bytes_between_peer_sites" in swarm
        else "-",
        "cross-cohort payload KB / sample (all-reduces' count)": f"{swarm['cross_cohort_bytes_per_sample'] / 1e3:.2f}"
        if swarm.get("cross_cohort_bytes_per_sample")
        else "-",
        "joiners": str(len(swarm["joiners"])),
        "joiners that ran 60 s: contributed within 60 s": _joiners_within(swarm, 60.0),
        "joiner to 1st contribution": f"median {statistics.median(joiners):.0f} s, max {max(joiners):.0f} s"
        if joiners
        else "-",
        "outer steps": str(swarm.get("outer_steps", 0)),
        "  peer-steps aborted": str(swarm.get("peer_outer_steps_aborted", 0)),
        "accuracy largest": f"{100 * quality['largest']:.2f} %" if "largest" in quality else "-",
        "accuracy smallest": f"{100 * quality['smallest']:.2f} %" if "smallest" in quality else "-",
        # stereo tasks: end-point error in pixels (lower is better)
        "EPE largest": f"{epe['largest']:.3f} px" if "largest" in epe else "-",
        "EPE smallest": f"{epe['smallest']:.3f} px" if "smallest" in epe else "-",
        "identical final state": str(summary["identical_final_state"]),
        "load avg before / after": "{:.1f} / {:.1f}".format(
            summary["bench"]["load_before"][0], summary["bench"]["load_after"][0]
        ),
    }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--peers", type=int, default=8)
    parser.add_argument("--target-samples", type=int, default=256)
    parser.add_argument("--profiles", default="loopback,lan,broadband,home,broadband-churn")
    parser.add_argument("--time-limit", type=float, default=900, help="seconds per profile run")
    parser.add_argument("--out", type=Path, default=Path(f"swarm-wan-{time.strftime('%Y%m%d-%H%M%S')}"))
    parser.add_argument("--sync", default="every-step", help="every-step, outer, or both: every-step,outer")
    parser.add_argument("--inner-steps", type=int, default=5)
    parser.add_argument("--outer-compression", default="int8")
    parser.add_argument("--outer-lr", default="1.0")
    parser.add_argument("--outer-momentum", default="0.0")
    parser.add_argument("--no-outer-overlap", dest="outer_overlap", action="store_false")
    parser.add_argument("swarm_args", nargs="*", help="more manta-swarm options for every profile (after --)")
    args = parser.parse_args()
    syncs = args.sync.split(",")
    if any(m not in ("every-step", "outer") for m in syncs):
        sys.exit(f"--sync {args.sync}: modes are every-step and outer")
    if "outer" in syncs and args.rounds % args.inner_steps:
        sys.exit(f"--rounds {args.rounds} is not a multiple of --inner-steps {args.inner_steps}")
    profile_names = args.profiles.split(",")
    base = profiles(args.peers)
    unknown = [n for n in profile_names if n not in base]
    if unknown:
        sys.exit(f"unknown profile(s) {', '.join(unknown)}; choose from {', '.join(base)}")
    # one run per profile and mode; a single mode keeps the profiles' plain names
    known = {
        (n if len(syncs) == 1 else f"{n}@{m}"): [*base[n], *sync_args(m, args)]
        for n in profile_names
        for m in syncs
    }
    names = list(known)
    if args.peers < 4 or args.peers % 4:
        sys.exit("--peers must be a multiple of 4 (2 peers per site; a quarter of the home sites behind NAT)")
    if os.geteuid() != 0 and any("--sites" in known[n] for n in names):
        sys.exit("the emulated-internet profiles need root (network namespaces); run with sudo")
    args.out.mkdir(parents=True, exist_ok=True)
    print(
        f"machine: {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; results under {args.out}",
        flush=True,
    )
    results = {name: run_profile(name, known[name], args) for name in names}
    table = {name: figures(s, args.out / name) for name, s in results.items()}
    for name in names:  # the outer mode's wide-area saving, against the same profile's every-step run
        profile, _, mode = name.partition("@")
        ours, theirs = results[name], results.get(f"{profile}@every-step", {})
        per = (ours.get("swarm") or {}).get("wan_bytes_per_sample")
        base_per = (theirs.get("swarm") or {}).get("wan_bytes_per_sample")
        if mode == "outer" and per and base_per:
            table[name]["WAN bytes / sample vs every-step"] = f"{base_per / per:.1f}x fewer"
        cross = (ours.get("swarm") or {}).get("cross_cohort_bytes_per_sample")
        base_cross = (theirs.get("swarm") or {}).get("cross_cohort_bytes_per_sample")
        if mode == "outer" and cross and base_cross:
            table[name]["cross-cohort payload / sample vs every-step"] = f"{base_cross / cross:.0f}x fewer"
    rows = list(dict.fromkeys(k for t in table.values() if len(t) > 1 for k in t))
    print("\n| figure | " + " | ".join(names) + " |")
    print("|---|" + "---:|" * len(names))
    for row in rows:
        print(f"| {row} | " + " | ".join(table[n].get(row, "-") for n in names) + " |")
    for name, s in results.items():
        if not s.get("failed"):
            print(f"\n{name}: {s['bench']['command']}")
            reasons = list(s["swarm"]["abort_reasons"].items())[:3]
            if reasons:
                print("  aborts: " + "; ".join(f"{n}x {r}" for r, n in reasons))
    (args.out / "table.json").write_text(json.dumps(table, indent=2))


if __name__ == "__main__":
    main()
