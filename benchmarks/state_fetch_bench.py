"""A joiner's state download from one holder against the same state spread over several holders, on
the emulated internet (:mod:`testbed.wan`), bytes counted on the joiner's own access link.

On the open internet a download is bounded by its server's uplink (home uplinks are 10-50 Mbit/s),
not by the joiner's downlink. Catch-up asks every peer that reported the committed state for a page
each (:func:`hivemind_adapter.paged_blobs.fetch_spread`). This runs one holder against several on
real namespaces, shaped links and libp2p, in one run, and prints them side by side (hivemind's own
state sharing, one server, was the baseline until ``c930e00``: ``git show c930e00:<this file>``)::

    python -m benchmarks.state_fetch_bench                       # 1, 2, 4 holders; 6.3 and 25 MB
    python -m benchmarks.state_fetch_bench --holders 1,4 --megabytes 6.3 --uplink 10mbit

Each holder is a process in a site of its own (a DHT node and a blob server holding the states);
the joiner is one process in another site that fetches on command, so start-up is not timed. Needs
root (network namespaces); every namespace and process it starts is removed at the end.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HANDLER = "bench/state-fetch"


def _blob(megabytes: float) -> tuple[str, bytes]:
    data = random.Random(int(megabytes * 1000)).randbytes(int(megabytes * 1_000_000))
    return hashlib.sha256(data).hexdigest(), data


def _node(address: str, initial_peers: list[str]):
    from hivemind_adapter.dht import start_dht
    from hivemind_adapter.p2p import Endpoint

    dht = start_dht(host_maddrs=[f"/ip4/{address}/tcp/0"], initial_peers=initial_peers)
    return dht, Endpoint(dht, "bench")


def serve(address: str, initial_peers: list[str], sizes: list[float]) -> None:
    """A holder: serves every state size until its stdin closes."""
    from hivemind_adapter.dht import visible_maddrs
    from hivemind_adapter.paged_blobs import BlobServer

    dht, endpoint = _node(address, initial_peers)
    server = BlobServer(endpoint, HANDLER)
    for size in sizes:
        key, data = _blob(size)
        server.put(key, data)
    print(
        json.dumps({"peer_id": endpoint.peer_id, "maddrs": [str(m) for m in visible_maddrs(dht)]}), flush=True
    )
    sys.stdin.read()
    server.close()
    endpoint.close()
    dht.shutdown()


def fetch(address: str, initial_peers: list[str]) -> None:
    """The joiner: for each command line (JSON: sources, key, bytes), one timed fetch; one JSON reply."""
    from hivemind_adapter.paged_blobs import fetch_spread

    dht, endpoint = _node(address, initial_peers)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        ask = json.loads(line)

        def check(blob: bytes, key: str = ask.get("key", "")) -> int:
            if hashlib.sha256(blob).hexdigest() != key:
                raise ValueError("wrong bytes")
            return len(blob)

        started = time.perf_counter()
        size = fetch_spread(
            endpoint, ask["sources"], HANDLER, ask["key"], check, 60.0, ask["bytes"], size=ask["bytes"]
        )
        seconds = time.perf_counter() - started
        print(json.dumps({"seconds": seconds, "bytes": size}), flush=True)
    endpoint.close()
    dht.shutdown()


def _readline(proc: subprocess.Popen, timeout: float) -> dict:
    import select

    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    if not ready:
        raise RuntimeError(f"no reply within {timeout:.0f} s")
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError(f"the process exited ({proc.poll()})")
    return json.loads(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--holders", default="1,2,4", help="holder counts to compare (the first is the baseline)"
    )
    parser.add_argument("--megabytes", default="6.3,25", help="state sizes in MB")
    parser.add_argument("--uplink", default="20mbit", help="every holder's uplink")
    parser.add_argument("--downlink", default="200mbit", help="the joiner's downlink")
    parser.add_argument("--delay", type=float, default=40.0, help="one-way delay of every access link, ms")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--fetch", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--address", help=argparse.SUPPRESS)
    parser.add_argument("--initial-peers", nargs="*", default=[], help=argparse.SUPPRESS)
    args = parser.parse_args()
    sizes = [float(x) for x in args.megabytes.split(",")]
    if args.serve:
        return serve(args.address, args.initial_peers, sizes)
    if args.fetch:
        return fetch(args.address, args.initial_peers)

    from testbed.wan.rates import parse_rate
    from testbed.wan.scenario import LinkProfile, Scenario, SiteSpec
    from testbed.wan.topology import EmulatedInternet

    counts = [int(x) for x in args.holders.split(",")]
    holder_link = LinkProfile(parse_rate(args.uplink), parse_rate("1gbit"), args.delay)
    joiner_link = LinkProfile(parse_rate("1gbit"), parse_rate(args.downlink), args.delay)
    sites = tuple(SiteSpec(f"holder-{i}", 1, holder_link) for i in range(max(counts))) + (
        SiteSpec("joiner", 1, joiner_link),
    )
    command = "python -m benchmarks.state_fetch_bench " + " ".join(sys.argv[1:])
    print(f"$ {command}\nmachine: {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}", flush=True)
    print(
        f"holders: {args.uplink} up each, {args.delay:g} ms; joiner: {args.downlink} down, {args.delay:g} ms"
    )
    me = [sys.executable, "-m", "benchmarks.state_fetch_bench", "--megabytes", args.megabytes]
    procs: list[subprocess.Popen] = []
    rows = []
    with (
        tempfile.TemporaryDirectory() as work,
        EmulatedInternet(Scenario(sites, LinkProfile()), Path(work)) as net,
    ):
        try:
            holders, initial = [], []
            for i in range(max(counts)):
                site = net.sites[f"holder-{i}"]
                proc = net.popen(site.name, [*me, "--serve", "--address", site.address, "--initial-peers", *initial],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
                procs.append(proc)
                holders.append(_readline(proc, 120))
                initial = initial or holders[0]["maddrs"]
            joiner_site = net.sites["joiner"]
            joiner = net.popen("joiner", [*me, "--fetch", "--address", joiner_site.address, "--initial-peers", *initial],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
            procs.append(joiner)
            _readline(joiner, 120)
            for megabytes in sizes:
                key, data = _blob(megabytes)
                for k in counts:
                    times, received = [], []
                    for _ in range(args.repeats):
                        before = net.link_counters()["joiner"].received_bytes
                        ask = {"sources": [h["peer_id"] for h in holders[:k]], "key": key, "bytes": len(data)}
                        joiner.stdin.write(json.dumps(ask) + "\n")
                        joiner.stdin.flush()
                        got = _readline(joiner, 600)
                        assert got["bytes"] == len(data), got
                        times.append(got["seconds"])
                        received.append(net.link_counters()["joiner"].received_bytes - before)
                    rows.append((megabytes, k, sorted(times)[len(times) // 2], max(received)))
                    runs = ", ".join(f"{t:.2f}" for t in times)
                    print(f"  {megabytes:g} MB, {_how(k)}: {runs} s", flush=True)
        finally:
            for proc in procs:
                if proc.stdin:
                    proc.stdin.close()
            for proc in procs:
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
    print(f"\nload after: {os.getloadavg()[0]:.1f}")
    print(
        f"| state | fetched as | median time | rate | joiner link received | faster than {_how(counts[0])} |"
    )
    print("|---:|---|---:|---:|---:|---:|")
    for megabytes, k, seconds, received in rows:
        base = next(s for m, kk, s, _ in rows if m == megabytes and kk == counts[0])
        print(f"| {megabytes:g} MB | {_how(k)} | {seconds:.2f} s | {megabytes * 8 / seconds:.1f} Mbit/s | "
              f"{received / 1e6:.1f} MB | {base / seconds:.2f}x |")  # fmt: skip


def _how(k: int) -> str:
    return f"pages from {k} holder(s)"


if __name__ == "__main__":
    main()
