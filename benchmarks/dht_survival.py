"""Whether a peer's DHT outlives its averagers' shutdowns: hivemind's DHT and MANTA's ``SwarmDHT``
side by side in one run.

A peer shuts averagers down whenever it changes cohort, and at its end. An averager's process ends
with requests of its own still on their way to the DHT's process, which fetches each request's reply
pipe from the sender's process as it opens it. With the sender gone, hivemind's loop logs the error
and waits 3 s, stalling every DHT call of the peer; on an EOFError it ends, and the peer's every later
DHT call hangs. ``SwarmDHT`` drops such a request at once (:mod:`hivemind_adapter.dht`).

Each run is a fresh interpreter that starts one DHT and then, ``--cycles`` times, starts an averager,
shuts it down and stores one value (a call that passes a pipe to the DHT's process, bounded at 10 s).
It stops at the first store that fails. ``--busy K`` adds K busy-looping processes beside it.

    python -m benchmarks.dht_survival [--cycles 40] [--repeats 3] [--busy 0]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import textwrap

RUN = textwrap.dedent("""
    import json, sys, time
    from hivemind_adapter.runtime import prepare_process
    prepare_process()
    import hivemind, torch
    from hivemind_adapter.allreduce import VerifiedAverager
    from hivemind_adapter.dht import SwarmDHT, store
    cls = SwarmDHT if sys.argv[1] == "swarm" else hivemind.DHT
    dht = cls(host_maddrs=["/ip4/127.0.0.1/tcp/0"], start=True)
    survived, started = 0, time.monotonic()
    for i in range(int(sys.argv[2])):
        averager = VerifiedAverager([torch.zeros(4)], dht, prefix=f"cycle{i}", start=True)
        averager.shutdown()
        if not (dht.is_alive() and store(dht, "probe", i, 60.0, subkey="s", timeout=10.0)):
            break
        survived += 1
    seconds = time.monotonic() - started
    print(json.dumps(dict(survived=survived, seconds=seconds, alive=dht.is_alive())))
    if dht.is_alive():
        dht.shutdown()
""")
VARIANTS = (("hivemind.DHT", "plain"), ("SwarmDHT", "swarm"))


def run_once(variant: str, cycles: int) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", RUN, variant, str(cycles)], capture_output=True, text=True, timeout=1800
    )
    if done.returncode != 0 or not done.stdout.strip():
        raise SystemExit(f"dht_survival: the {variant} run failed: {done.stderr.strip().splitlines()[-1:]}")
    out = json.loads(done.stdout.strip().splitlines()[-1])
    out["dropped"] = done.stderr.count("a DHT request was dropped")
    out["stalled"] = done.stderr.count("[hivemind.dht.dht._run")  # hivemind's loop: logged, then 3 s
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=40, help="averagers started and shut down per run")
    parser.add_argument("--repeats", type=int, default=3, help="fresh interpreters per variant")
    parser.add_argument("--busy", type=int, default=0, help="busy-looping processes beside the runs")
    args = parser.parse_args()
    if args.cycles < 1 or args.repeats < 1 or args.busy < 0:
        raise SystemExit("dht_survival: --cycles and --repeats must be at least 1, --busy at least 0")
    print(f"command: python -m benchmarks.dht_survival {' '.join(shlex.quote(a) for a in sys.argv[1:])}")
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}, {args.busy} busy loop(s)")
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    try:
        results = {}
        for name, variant in VARIANTS:
            results[name] = []
            for i in range(args.repeats):
                print(f"  {name}: run {i + 1} of {args.repeats}", file=sys.stderr, flush=True)
                results[name].append(run_once(variant, args.cycles))
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait(timeout=10)
    print("| DHT | runs whose DHT lived all cycles | cycles lived (median) | s per cycle (median) | requests it could not open (all runs) |")  # fmt: skip
    print("|---|---:|---:|---:|---:|")
    for name, runs in results.items():
        whole = sum(r["survived"] == args.cycles for r in runs)
        lived = statistics.median(r["survived"] for r in runs)
        per_cycle = statistics.median(r["seconds"] / max(1, r["survived"]) for r in runs)
        unopened = sum(r["dropped"] + r["stalled"] for r in runs)
        print(
            f"| {name} | {whole} of {len(runs)} | {lived:g} of {args.cycles} | {per_cycle:.2f} | {unopened} |"
        )
    plain, swarm = (
        statistics.median(r["seconds"] / max(1, r["survived"]) for r in results[n]) for n, _ in VARIANTS
    )
    print(f"s per cycle, hivemind.DHT / SwarmDHT: {plain / swarm:.1f}x")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
