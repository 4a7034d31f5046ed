"""Averaging one 100 MB float32 vector over 4 local processes, three ways, in one run.

(i)   torch.distributed gloo all_reduce over 4 processes: this machine's reference for moving bytes.
(ii)  flat hivemind: the 4 processes as 4 peers of one DecentralizedAverager group (butterfly
      all-reduce through each peer's p2pd daemon).
(iii) MANTA hierarchical: the 4 processes as 2 cohorts x 2. Members of a cohort share a host here, so
      node affinity reduces them with torch.distributed (gloo) and only one process per cohort takes
      part in the cross-cohort hivemind all-reduce (exact, verified and committed through the DHT,
      see peer/averaging/hierarchy.py); the result is then broadcast back inside the host with gloo.
      Each agent serves its DHT node and averagers from its own threads, as `manta-peer` does.
      This is what a 2-worker peer (`--gpus all` on 2 GPUs, or 2 CPU workers) does in every round.

Each round is timed from a barrier (all processes hold their local vector) until every process holds
the average; the median of ``--rounds`` rounds (after one warm-up) is printed with ratios. Every
result is checked against the true mean.

    python -m benchmarks.averaging_bench [--mb 100] [--rounds 5] [--fp16]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import socket
import statistics
import sys
import time

from hivemind_adapter.runtime import prepare_process, start_orphan_reaper

prepare_process()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

WORLD = 4


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _local_vector(rank: int, numel: int) -> torch.Tensor:
    return torch.full((numel,), float(rank))  # mean over ranks 0..3 is 1.5 everywhere


def _wrong(vec: torch.Tensor, expected: float = 1.5) -> bool:
    """Whether any element missed the true mean: hivemind can report success after a partial
    all-reduce (a part keeps local values), so every result is checked, and counted, not trusted."""
    return bool(((vec - expected).abs() > 1e-2).any())


# ---------------------------------------------------------------------------- (i) gloo


def _gloo_worker(rank, barrier, out, port, numel, rounds):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    times, wrong = [], 0
    for _ in range(rounds + 1):
        vec = _local_vector(rank, numel)
        barrier.wait()
        t0 = time.perf_counter()
        dist.all_reduce(vec)
        vec /= WORLD
        dist.barrier()
        times.append(time.perf_counter() - t0)
        wrong += _wrong(vec)
    dist.destroy_process_group()
    out.put((rank, times[1:], wrong))


# ---------------------------------------------------------------------------- (ii) flat hivemind


def _flat_worker(rank, barrier, out, initial_peers, numel, rounds, fp16):
    import hivemind
    from hivemind.compression import Float16Compression, NoCompression

    start_orphan_reaper()
    dht = hivemind.DHT(initial_peers=initial_peers, host_maddrs=["/ip4/127.0.0.1/tcp/0"], start=True)
    vec = _local_vector(rank, numel)
    averager = hivemind.DecentralizedAverager(
        [vec],
        dht,
        prefix="bench_flat",
        target_group_size=WORLD,
        min_group_size=WORLD,
        min_matchmaking_time=2.0,
        request_timeout=1.0,
        next_chunk_timeout=30.0,
        allreduce_timeout=120.0,
        compression=Float16Compression() if fp16 else NoCompression(),
        start=True,
    )
    times, wrong = [], 0
    for _ in range(rounds + 1):
        with averager.get_tensors() as (t,):
            t.copy_(_local_vector(rank, numel))
        barrier.wait()
        t0 = time.perf_counter()
        averager.step(timeout=120)
        times.append(time.perf_counter() - t0)
        with averager.get_tensors() as (t,):
            wrong += _wrong(t)
    averager.shutdown()
    dht.shutdown()
    out.put((rank, times[1:], wrong))


# ---------------------------------------------------------------------------- (iii) MANTA hierarchical


def _agents_roster(dht, size: int) -> list[str]:
    """The agents' peer ids (the commit quorum counts them), exchanged through the DHT."""
    from hivemind_adapter.dht import peer_id, read_entries, store

    store(dht, "bench_hier_roster", True, 600.0, subkey=peer_id(dht))
    deadline = time.monotonic() + 60
    while len(found := read_entries(dht, "bench_hier_roster")) < size:
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {len(found)} of {size} agents found each other")
        time.sleep(0.2)
    return sorted(found)


def _hier_worker(rank, barrier, out, initial_peers, ports, numel, rounds, fp16):
    """Ranks 0,1 form host/cohort A, ranks 2,3 host/cohort B; the lower rank of each runs the peer agent."""
    from hivemind_adapter.dht import start_dht
    from peer.averaging.factory import build_averager
    from peer.averaging.stage import AveragingTimeouts

    start_orphan_reaper()
    host, local_rank = divmod(rank, 2)
    agent = local_rank == 0
    averager = dht = None
    if agent:  # the DHT node a peer runs: served from a thread of the agent, as the averagers are
        dht = start_dht(initial_peers=initial_peers, host_maddrs=["/ip4/127.0.0.1/tcp/0"])
        averager = build_averager(
            dht,
            "bench_hier",
            f"cohort-{host}",
            [torch.zeros(numel)],
            cross_codec="fp16" if fp16 else "none",
            timeouts=AveragingTimeouts(
                matchmaking=2.0, request=1.0, next_chunk=30.0, allreduce=120.0, step=120.0, commit=30.0
            ),
        )
        roster = _agents_roster(dht, 2)
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{ports[host]}", rank=local_rank, world_size=2
    )
    times, wrong = [], 0
    for r in range(rounds + 1):
        vec = _local_vector(rank, numel)
        samples = 1
        barrier.wait()
        t0 = time.perf_counter()
        dist.all_reduce(vec)  # (a) host stage: the sum over this host's workers
        if agent:  # (b)+(c) cohort and cross-cohort stages; a cohort here is one host
            outcome = averager.average(
                r, [vec], 2 * samples, cohort_size=1, num_cohorts=2, expected_peers=roster
            )
            if not outcome.committed:
                raise RuntimeError(f"round {r} aborted: {outcome.reason}")
            vec = outcome.tensors[0]
        dist.broadcast(vec, src=0)  # (d) the result reaches every worker of the host
        times.append(time.perf_counter() - t0)
        wrong += _wrong(vec)
    dist.destroy_process_group()
    if agent:
        averager.shutdown()
        dht.shutdown()
    out.put((rank, times[1:], wrong))


# ---------------------------------------------------------------------------- driver


def _run(target, args: tuple, label: str) -> tuple[list[float], int]:
    ctx = mp.get_context("fork")
    barrier, out = ctx.Barrier(WORLD), ctx.Queue()
    procs = [ctx.Process(target=target, args=(rank, barrier, out, *args)) for rank in range(WORLD)]
    for p in procs:
        p.start()
    per_rank, wrong = {}, 0
    try:
        while len(per_rank) < WORLD:
            rank, times, bad = out.get(timeout=900)
            per_rank[rank], wrong = times, wrong + bad
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    # A round is over when the slowest process has the result.
    rounds = [max(per_rank[r][i] for r in per_rank) for i in range(len(per_rank[0]))]
    note = f"  ({wrong} wrong result(s) across processes)" if wrong else ""
    print(f"  {label:<34} rounds: " + " ".join(f"{t:.2f}" for t in rounds) + f" s{note}", flush=True)
    return rounds, wrong


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=100.0, help="vector size in MB (float32)")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds per method (median reported)")
    parser.add_argument("--fp16", action="store_true", help="also run (ii) and (iii) with fp16 compression")
    args = parser.parse_args(argv)
    numel = int(args.mb * 1e6 / 4)
    start_orphan_reaper()
    import hivemind

    print(
        f"averaging {args.mb:.0f} MB float32 over {WORLD} local processes, {args.rounds} rounds each "
        f"(+1 warm-up); load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    boot = hivemind.DHT(host_maddrs=["/ip4/127.0.0.1/tcp/0"], start=True)
    maddrs = [str(m) for m in boot.get_visible_maddrs()]
    results = {}
    try:
        results["(i) gloo all_reduce"] = _run(
            _gloo_worker, (_free_port(), numel, args.rounds), "(i) gloo all_reduce"
        )
        for fp16 in [False, True] if args.fp16 else [False]:
            tag = " fp16" if fp16 else ""
            results[f"(ii) flat hivemind{tag}"] = _run(
                _flat_worker, (maddrs, numel, args.rounds, fp16), f"(ii) flat hivemind, 4 peers{tag}"
            )
            ports = (_free_port(), _free_port())
            results[f"(iii) MANTA hierarchical{tag}"] = _run(
                _hier_worker, (maddrs, ports, numel, args.rounds, fp16), f"(iii) MANTA 2 cohorts x 2{tag}"
            )
    finally:
        boot.shutdown()

    medians = {k: statistics.median(v[0]) for k, v in results.items()}
    ref = medians["(i) gloo all_reduce"]
    flat = medians["(ii) flat hivemind"]
    print(
        f"\n{'method':<32} {'median s':>9} {'MB/s':>8} {'vs gloo':>8} {'vs flat hivemind':>17} {'wrong':>6}"
    )
    for name, t in medians.items():
        print(
            f"{name:<32} {t:>9.3f} {args.mb / t:>8.0f} {t / ref:>7.1f}x {flat / t:>16.2f}x {results[name][1]:>6}"
        )
    hier = medians["(iii) MANTA hierarchical"]
    print()
    targets = [("(iii) faster than (ii)", flat / hier, hier < flat)]
    if args.mb <= 3:  # the digits gradient: the fixed cost around the bytes
        targets.append(("(iii) at most 5x (i)", hier / ref, hier <= 5.0 * ref))
    if args.mb >= 100:  # where the bytes dominate
        targets.append(("(iii) at least 2x faster than (ii)", flat / hier, flat / hier >= 2.0))
    for target, ratio, met in targets:
        print(f"target: {target}: {ratio:.2f}x, {'met' if met else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
