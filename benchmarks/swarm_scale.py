"""Thin peers at 8, 16, 32 and 64: what a round's protocol costs each peer as the swarm grows.

A thin peer (:mod:`benchmarks.thin_peer`) runs everything of a round that crosses the network, exactly
as a real peer does, and nothing else: a DHT node with MANTA's record validator, a signed announcement kept fresh in the
roster, cohorts by node affinity (``max_group_size`` 4: every peer is on this host, so cohorts of 4),
the progress board read and written while it "computes" (a fixed ``--compute`` seconds instead of
training), then the hierarchical averaging (cohort, the cross-cohort tree of groups of at most
``--cross-group`` leaders, broadcast) of a random gradient of the real size, and the signed commit
board's quorum. No workers, no state downloads, no receipts.

Per swarm size it prints, over the measured rounds, per peer: the round time, the share of rounds
that committed, DHT requests made, the coordination it sent (:mod:`hivemind_adapter.control_traffic`),
bytes sent (counted by the kernel: each peer's processes, its p2pd included, sit in their own cgroup,
and an iptables rule per cgroup counts their output), the CPU time of a peer's processes (its
cgroup's), and memory (the proportional set size of all of a peer's processes). The gradient is the digits supernet's at width 0.5 by default.

    python -m benchmarks.swarm_scale [--peers 8 16 32 64] [--rounds 5] [--compute 2] [--bucket-sizes 20 5]
        [--store-search values nodes] [--commit board certificates] [--plan roster directory]
        [--trace rounds.jsonl] [--certificates]

``--bucket-sizes`` runs every size with each DHT bucket size (Kademlia's k, also every lookup's
beam), ``--store-search`` with a store's search for nodes asking for values too (``values``,
hivemind's) or not (``nodes``: :mod:`hivemind_adapter.store_search`), ``--commit`` with the board's
quorum or commit certificates deciding the rounds (:mod:`peer.commit.certified`), ``--plan`` with
certificate rounds planned from each peer's roster read or from the cohort directory (signed and
served by the benchmark's stand-in aggregator, :mod:`aggregator.cohort_directory`, as a real
aggregator does); each size's variants are compared. ``--trace`` has every peer append one JSON line
per round to a file (its attempt, cohort, head, result, stage times, abort reason). ``--certificates`` has the peers also relay commit
certificates over direct calls (:mod:`benchmarks.certificates_beside`) and prints their verdicts,
times and bytes beside the board's, on the same attempts. Needs root (cgroups, iptables); every cgroup and rule it makes is removed, also on Ctrl-C.
"""

from __future__ import annotations

import argparse
import collections
import gc
import multiprocessing as mp
import os
import queue
import shutil
import signal
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from hivemind_adapter.runtime import prepare_process, start_orphan_reaper

prepare_process()

import torch  # noqa: E402

from aggregator.cohort_directory import DirectoryPublisher  # noqa: E402
from benchmarks.certificates_beside import CertificateFigures  # noqa: E402
from benchmarks.peer_accounts import PeerAccounts  # noqa: E402
from benchmarks.thin_peer import BENCH_AGGREGATOR, SPEC, TASK, PeerFigures, ThinOptions, thin_peer  # noqa: E402
from hivemind_adapter.dht import DHT_BUCKET_SIZE, speaker, start_dht, visible_maddrs  # noqa: E402
from hivemind_adapter.p2p import Endpoint  # noqa: E402
from peer.commit.boards import SignedCommitBoard  # noqa: E402
from peer.roster_view import read_roster  # noqa: E402

# ------------------------------------------------------------------ one swarm size


START_BATCH = 8
FIRST_EPOCH_WAIT = 60.0  # seconds the stand-in aggregator has to sign the first directory epoch
MEMORY_RESERVE_MIB = 2048  # never start more peers (nor run rounds) with less than this available


class DidNotFit(Exception):
    def __init__(self, started: int, available_mib: float, during_rounds: bool = False):
        when = "during their rounds" if during_rounds else "then"
        super().__init__(f"{started} peers started, {when} only {available_mib:.0f} MiB of memory was left")


class FileFlag:
    """A flag the benchmark raises for its peers. Not a multiprocessing.Event: a peer killed (by the
    kernel, out of memory) while it held the Event's lock would leave the benchmark hanging on it."""

    def __init__(self, path: Path):
        self.path = path

    def set(self) -> None:
        self.path.touch()

    def wait(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not self.path.exists():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.2)
        return True


def _available_mib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024
    return float("inf")


@dataclass
class ScaleRow:
    peers: int
    bucket_size: int
    variant: str
    cohorts: int
    started_s: float
    round_s: float
    committed: float
    dht_requests: float
    sent_mb: float
    cpu_s: float  # CPU seconds a peer's processes (its p2pd included) used per round
    control_kb: float  # coordination payload a peer sent per round (hivemind_adapter.control_traffic)
    control_messages: float
    pss_mib: float
    load: float
    reasons: collections.Counter = field(default_factory=collections.Counter)
    requests_by_kind: dict[str, float] = field(default_factory=dict)
    round_calls: dict[str, float] = field(default_factory=dict)
    certificates: list[CertificateFigures] = field(default_factory=list)


def run_size(n: int, opts: ThinOptions) -> ScaleRow:
    ctx = mp.get_context("fork")
    gc.freeze()  # as a peer forks its worker: the collector never dirties the imported objects' pages
    ready, results = ctx.Queue(), ctx.Queue()
    accounts = PeerAccounts(f"{os.getpid()}x{n}", n)
    go, done = FileFlag(accounts.flags / "go"), FileFlag(accounts.flags / "done")
    boot = start_dht(
        host_maddrs=["/ip4/127.0.0.1/tcp/0"], bucket_size=opts.bucket_size,
        nodes_only_store_search=opts.store_search == "nodes",
    )  # fmt: skip
    procs, publisher = [], None
    try:
        initial = visible_maddrs(boot)
        directory_peer = boot.peer_id.to_base58()  # the stand-in aggregator serves the directory
        t0 = time.monotonic()
        for batch in range(0, n, START_BATCH):  # in batches, watching memory: where it stops is a result
            if (available := _available_mib()) < MEMORY_RESERVE_MIB:
                raise DidNotFit(batch, available)
            for i in range(batch, min(n, batch + START_BATCH)):
                p = ctx.Process(
                    target=thin_peer,
                    args=(i, initial, opts, accounts.cgroups[i], ready, go, done, results, directory_peer),
                )  # fmt: skip
                p.start()
                procs.append(p)
            for k in range(batch, min(n, batch + START_BATCH)):
                while True:
                    try:
                        ready.get(timeout=5)
                        break
                    except queue.Empty:
                        if dead := [i for i, p in enumerate(procs) if p.exitcode is not None]:
                            raise RuntimeError(f"thin peer(s) {dead} exited during start-up") from None
                        if time.monotonic() - t0 > 900:
                            raise RuntimeError(f"only {k} of {n} thin peers started within 900 s") from None
                print(f"\r  {n} peers: {k + 1} started ({time.monotonic() - t0:.0f} s)", end="", flush=True)
        if (available := _available_mib()) < MEMORY_RESERVE_MIB:
            raise DidNotFit(n, available)
        started = time.monotonic() - t0
        time.sleep(5)  # announcements reach every roster
        if opts.plan == "directory":  # after the peers forked: its threads stay in this process
            publisher = _publish_directory(boot)
        sent_before, cpu_before = accounts.bytes_sent(), accounts.cpu_seconds()
        go.set()
        figures: dict[int, PeerFigures] = {}
        deadline = time.monotonic() + opts.rounds * 300
        while len(figures) < n and time.monotonic() < deadline:
            if (available := _available_mib()) < MEMORY_RESERVE_MIB:
                raise DidNotFit(n, available, during_rounds=True)
            try:
                index, got = results.get(timeout=5)
                figures[index] = got
            except queue.Empty:
                pass
            print(f"\r  {n} peers: {len(figures)} of {n} finished their rounds", end="", flush=True)
        print()
        sent = [after - before for after, before in zip(accounts.bytes_sent(), sent_before)]
        cpu = [after - before for after, before in zip(accounts.cpu_seconds(), cpu_before)]
        pss = accounts.pss_mib()
        load = os.getloadavg()[0]
        done.set()
        rounds = [s for f in figures.values() for s in f.round_seconds]
        return ScaleRow(
            peers=n,
            bucket_size=opts.bucket_size,
            variant=opts.variant,
            cohorts=max((f.cohorts for f in figures.values()), default=0),
            started_s=started,
            round_s=statistics.median(rounds) if rounds else float("nan"),
            committed=sum(f.committed for f in figures.values()) / max(1, n * opts.rounds),
            dht_requests=statistics.mean(f.dht_requests / opts.rounds for f in figures.values())
            if figures
            else 0.0,
            sent_mb=statistics.mean(sent) / opts.rounds / 1e6,
            cpu_s=statistics.mean(cpu) / opts.rounds,
            control_kb=statistics.mean(f.control.bytes / opts.rounds / 1e3 for f in figures.values())
            if figures
            else 0.0,
            control_messages=statistics.mean(f.control.messages / opts.rounds for f in figures.values())
            if figures
            else 0.0,
            pss_mib=statistics.mean(pss),
            load=load,
            reasons=collections.Counter(r.split(":")[0][:60] for f in figures.values() for r in f.reasons),
            requests_by_kind=_per_peer_round([f.requests_by_kind for f in figures.values()], opts.rounds),
            round_calls=_per_peer_round([f.round_calls for f in figures.values()], opts.rounds),
            certificates=[f.certificates for f in figures.values() if f.certificates is not None],
        )
    finally:
        interrupt = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C cannot cut the clean-up
        try:
            done.set()
            go.set()
            deadline = time.monotonic() + 30  # peers that finished shut down on their own
            for p in procs:
                p.join(timeout=max(0.1, deadline - time.monotonic()))
            accounts.kill()  # the rest (interrupted mid-round), with every process they started
            deadline = time.monotonic() + 10
            for p in procs:
                p.join(timeout=max(0.1, deadline - time.monotonic()))
            if publisher is not None:
                publisher.stop()
                publisher.endpoint.close()
            try:
                boot.shutdown()
            except Exception as e:  # its process was interrupted too
                print(f"swarm_scale: the bootstrap DHT: {e!r}", file=sys.stderr)
        finally:
            accounts.close()
            gc.unfreeze()  # what the thin peers shared is freed normally at exit
            signal.signal(signal.SIGINT, interrupt)


def _publish_directory(boot) -> DirectoryPublisher:
    """The cohort directory of the thin peers' roster, signed and served from the bootstrap node as
    an aggregator does (the newest attempt from the commit board); returns once the first epoch is
    out (it governs from attempt 1: attempt 0 plans from the rosters)."""
    board = SignedCommitBoard(boot, TASK, speaker(boot, BENCH_AGGREGATOR))
    publisher = DirectoryPublisher(
        boot, Endpoint(boot, "directory"), BENCH_AGGREGATOR, SPEC,
        lambda: [p.announcement for p in read_roster(boot, SPEC)], board.latest_attempt,
    )  # fmt: skip
    publisher.start()
    deadline = time.monotonic() + FIRST_EPOCH_WAIT
    while publisher.newest() is None and time.monotonic() < deadline:
        time.sleep(1.0)
    if publisher.newest() is None:
        publisher.stop()
        publisher.endpoint.close()
        raise RuntimeError(
            f"the stand-in aggregator signed no directory epoch within {FIRST_EPOCH_WAIT:.0f} s"
        )
    print(f"\r  directory epoch {publisher.newest().epoch}: {publisher.newest().size} member(s)", flush=True)
    return publisher


def describe_certificates(row: ScaleRow, rounds: int) -> str:
    """The certificates' verdicts, times and bytes beside the board's, in one line."""
    figures = row.certificates
    peer_rounds = sum(f.rounds for f in figures)
    committed = sum(f.committed for f in figures)
    seconds = [s for f in figures for s in f.seconds]
    board = [s for f in figures for s in f.board_seconds]
    kb = statistics.mean(f.sent_bytes for f in figures) / rounds / 1e3
    messages = statistics.mean(f.sent_messages for f in figures) / rounds
    return (
        f"{row.peers} peers, certificates beside the board: committed {committed} of {peer_rounds} peer-rounds "
        f"(the board {row.committed:.0%}), {sum(f.agreed for f in figures)} on the board's result, "
        f"{sum(f.disagreed for f in figures)} on another; median commit "
        f"{statistics.median(seconds) if seconds else float('nan'):.2f} s after the vote "
        f"(the board {statistics.median(board) if board else float('nan'):.2f} s after the report); "
        f"{kb:.1f} KB in {messages:.0f} messages sent per peer per round (the board's coordination: "
        f"{row.control_kb:.0f} KB)"
    )


def _per_peer_round(counts: list[dict[str, int]], rounds: int) -> dict[str, float]:
    total: collections.Counter[str] = collections.Counter()
    for c in counts:
        total.update(c)
    return {k: round(v / max(1, len(counts)) / rounds, 1) for k, v in sorted(total.items())}


def _digits_shapes() -> tuple[tuple[int, ...], ...]:
    """The gradient shapes of the digits supernet at width 0.5 (what the swarm benchmarks train)."""
    from supernet.workload import workload_for

    net = workload_for("digits", {"width_mult": 0.5}).build()
    return tuple(tuple(p.shape) for p in net.parameters())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peers", type=int, nargs="+", default=[8, 16, 32, 64])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--compute", type=float, default=2.0, help="seconds a thin peer 'computes' per round")
    parser.add_argument("--cross-group", type=int, default=8, help="cohort leaders per cross-cohort group")
    parser.add_argument(
        "--bucket-sizes", type=int, nargs="+", default=[DHT_BUCKET_SIZE],
        help=f"the DHT's k (lookup beam) to run each size with; hivemind's default is 20, MANTA's {DHT_BUCKET_SIZE}",
    )  # fmt: skip
    parser.add_argument(
        "--store-search", nargs="+", choices=["nodes", "values"], default=["nodes"],
        help="whether a store's search for nodes asks for nodes only (MANTA's) or values too (hivemind's)",
    )  # fmt: skip
    parser.add_argument(
        "--trace", default="", help="a file each thin peer appends one JSON line to per round"
    )
    parser.add_argument("--logs", default="", help="a folder each thin peer writes its DEBUG log to")
    parser.add_argument(
        "--commit", nargs="+", choices=("board", "certificates"), default=["board"],
        help="what decides a round; both: the two side by side, at each size",
    )  # fmt: skip
    parser.add_argument(
        "--plan", nargs="+", choices=("roster", "directory"), default=["roster"],
        help="where certificate rounds take their cohorts: each peer's roster read, or the cohort directory",
    )  # fmt: skip
    parser.add_argument(
        "--certificates", action="store_true",
        help="also relay commit certificates over direct calls and print them beside the board",
    )  # fmt: skip
    args = parser.parse_args(argv)
    refused = None
    if min(args.bucket_sizes) < 5:
        refused = "--bucket-sizes must be at least 5 (hivemind's replicas per value)"
    elif os.geteuid() != 0 or shutil.which("iptables") is None:
        refused = "needs root and iptables (`make system-tools`): a cgroup and rule per peer"
    if refused:
        print(f"swarm_scale: {refused}", file=sys.stderr)
        return 2
    if args.logs:
        os.makedirs(args.logs, exist_ok=True)
    start_orphan_reaper()
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # a kill cleans up as Ctrl-C does
    shapes = _digits_shapes()
    numel = sum(torch.Size(s).numel() for s in shapes)
    print(f"command: python -m benchmarks.swarm_scale {' '.join(sys.argv[1:])}".rstrip())
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} cores")
    print(f"gradient: {numel * 4 / 1e6:.1f} MB ({len(shapes)} tensors); cohorts of 4; {args.rounds} rounds")
    rows, did_not_fit = [], {}  # variant -> the smallest swarm that did not fit with it
    variants = [
        (k, search, c, plan)
        for k in args.bucket_sizes
        for search in args.store_search
        for c in args.commit
        for plan in (args.plan if c == "certificates" else ["roster"])  # the board's rounds read rosters
    ]
    for (k, search, commit, plan), n in [(v, n) for n in args.peers for v in variants]:
        opts = ThinOptions(
            shapes, args.rounds, args.compute, args.cross_group, bucket_size=k, store_search=search,
            trace=args.trace, logs=args.logs, certificates=args.certificates, commit=commit, plan=plan,
        )  # fmt: skip
        if n >= did_not_fit.get(opts.variant, n + 1):
            continue
        try:
            rows.append(run_size(n, opts))
        except DidNotFit as e:
            print(f"\n  {n} peers do not fit on this machine: {e}", flush=True)
            did_not_fit[opts.variant] = n
            continue
        r = rows[-1]
        print(
            f"  {n} peers, {opts.variant}: median round {r.round_s:.1f} s, {r.committed:.0%} committed, "
            f"{r.dht_requests:.0f} DHT requests, {r.sent_mb:.1f} MB sent and {r.cpu_s:.2f} CPU s per peer per round "
            f"(coordination: {r.control_kb:.0f} KB in {r.control_messages:.0f} messages), "
            f"{r.pss_mib:.0f} MiB per peer; aborts: {dict(r.reasons) or 'none'}\n"
            f"    DHT requests by kind: {r.requests_by_kind}; the round's own DHT calls: {r.round_calls}",
            flush=True,
        )
    if not rows:
        return 1
    for r in rows:
        if r.certificates:
            print(describe_certificates(r, args.rounds))
    print()
    header = (
        f"{'peers':>5} {'variant':>38} {'cohorts':>7} {'start-up':>9} {'round':>7} {'committed':>9} "
        f"{'DHT req/peer/round':>18} {'x':>5} {'MB sent/peer/round':>18} {'x':>5} "
        f"{'control KB/peer/round':>21} {'x':>5} {'CPU s/peer/round':>16} {'MiB/peer':>8} {'load':>5}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        base = next(b for b in rows if b.variant == r.variant)  # growth with n in the same variant
        print(
            f"{r.peers:>5} {r.variant:>38} {r.cohorts:>7} {r.started_s:>8.0f}s {r.round_s:>6.1f}s {r.committed:>9.0%} "
            f"{r.dht_requests:>18.0f} {r.dht_requests / max(base.dht_requests, 1e-9):>4.1f}x "
            f"{r.sent_mb:>18.1f} {r.sent_mb / max(base.sent_mb, 1e-9):>4.1f}x "
            f"{r.control_kb:>21.0f} {r.control_kb / max(base.control_kb, 1e-9):>4.1f}x {r.cpu_s:>16.2f} "
            f"{r.pss_mib:>8.0f} {r.load:>5.1f}"
        )
    for r in rows:  # each variant against the first, at the same size
        first = next(b for b in rows if b.peers == r.peers)
        if r is not first:
            print(
                f"{r.peers} peers, {r.variant} against {first.variant}: round "
                f"{r.round_s / first.round_s:.2f}x, committed {first.committed:.0%} -> {r.committed:.0%}, "
                f"DHT requests {r.dht_requests / max(first.dht_requests, 1e-9):.2f}x, "
                f"control bytes {r.control_kb / max(first.control_kb, 1e-9):.2f}x"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
