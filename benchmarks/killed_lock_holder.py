"""How often a DHT process killed while it answers calls leaves its whole process tree hung:
hivemind's import-time semaphore and MANTA's ``DeathSafeLock`` side by side in one run.

hivemind orders every process's writes of a future's result with one ``multiprocessing.Lock`` for
the tree. A process SIGKILLed between its write and the release leaves it held, and every later
result (every DHT call, every DHT's start) waits for ever (:mod:`hivemind_adapter.process_locks`).

Each run is a fresh interpreter. ``--kills`` times it starts a DHT, lets 4 threads call it without
pause for 0.3 s, SIGKILLs the DHT's process and then tries the tree's update lock for 3 s. A lock
still held ends the run (that interpreter is hung for good); the next run starts a fresh one, until
the variant has had ``--kills`` kills.

    python -m benchmarks.killed_lock_holder [--kills 40]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import textwrap

from hivemind_adapter.p2p_sockets import daemon_socket_files, remove_dead_daemon_sockets

RUN = textwrap.dedent("""
    import json, sys, threading, time
    from hivemind_adapter.runtime import prepare_process
    prepare_process()
    import hivemind_adapter.process_locks as process_locks
    if sys.argv[1] == "hivemind":
        process_locks._installed = True  # leave hivemind's semaphores in place
    from hivemind.utils.mpfuture import MPFuture
    from hivemind_adapter.dht import start_dht
    kills, hung = 0, False
    for _ in range(int(sys.argv[2])):
        dht = start_dht(host_maddrs=["/ip4/127.0.0.1/tcp/0"])
        stop = threading.Event()
        def call():
            while not stop.is_set():
                try:
                    dht.get("probe", latest=True, return_future=True).result(timeout=2)
                except Exception:
                    return
        callers = [threading.Thread(target=call, daemon=True) for _ in range(4)]
        for caller in callers:
            caller.start()
        time.sleep(0.3)
        dht.kill()
        dht.join(10)
        stop.set()
        kills += 1
        if not MPFuture._update_lock.acquire(timeout=3):
            hung = True
            break
        MPFuture._update_lock.release()
        for caller in callers:
            caller.join(5)
    print(json.dumps(dict(kills=kills, hung=hung)), flush=True)
""")
VARIANTS = (("hivemind's semaphore", "hivemind"), ("DeathSafeLock", "death-safe"))


def run_variant(name: str, variant: str, kills: int) -> dict:
    """Kill DHTs until ``kills`` kills were made, in as many fresh interpreters as hangs required."""
    made, hangs, runs = 0, 0, 0
    while made < kills:
        runs += 1
        done = subprocess.run(
            [sys.executable, "-c", RUN, variant, str(kills - made)],
            capture_output=True,
            text=True,
            timeout=1800,
        )
        lines = done.stdout.strip().splitlines()
        if not lines:
            raise SystemExit(
                f"killed_lock_holder: the {name} run failed: {done.stderr.strip().splitlines()[-1:]}"
            )
        out = json.loads(lines[-1])
        made += out["kills"]
        hangs += out["hung"]
        print(f"  {name}: {made} of {kills} kills, {hangs} hung", file=sys.stderr, flush=True)
    return dict(kills=made, hangs=hangs, runs=runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=40, help="DHT processes killed per variant")
    args = parser.parse_args()
    if args.kills < 1:
        raise SystemExit("killed_lock_holder: --kills must be at least 1")
    print(
        f"command: python -m benchmarks.killed_lock_holder {' '.join(shlex.quote(a) for a in sys.argv[1:])}"
    )
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}")
    daemons = daemon_socket_files()
    try:
        results = {name: run_variant(name, variant, args.kills) for name, variant in VARIANTS}
    finally:
        remove_dead_daemon_sockets(daemons, patience=10.0)  # a killed DHT's daemon leaves its file
    print(
        "| the tree's update lock | DHTs killed while answering | kills that hung the tree | hung per kill |"
    )
    print("|---|---:|---:|---:|")
    for name, r in results.items():
        print(f"| {name} | {r['kills']} | {r['hangs']} | {r['hangs'] / r['kills']:.2f} |")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
