"""How long a peer waits for its training worker to end when it leaves: the worker ending through the
interpreter's teardown and through ``os._exit`` once its log is flushed (as :mod:`peer.worker` ends),
side by side in one run.

Each trial starts a real worker pool (one spawned CPU worker on the digits task, as a peer's), has it
compute and apply one round so that it holds what a trained worker holds (model, optimizer state,
autograd buffers, a gloo group), then times ``WorkerPool.stop()``: from the stop request until the
worker has ended. The teardown ending is this module's :func:`worker_with_teardown` (the worker's
``_serve`` loop, then a normal return).

``--busy N`` runs N busy loops beside it, as a peer's other processes (and other peers on the same
machine) load it when it leaves.

    python -m benchmarks.worker_exit [--trials 5] [--busy 2]
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import os
import shlex
import statistics
import sys
import time
import traceback

from hivemind_adapter.runtime import set_parent_death_signal


def worker_with_teardown(spec, conn, shared) -> None:
    """The worker ending the ordinary way: ``_serve``, then back to multiprocessing, which runs the
    interpreter's teardown (finalizers, the collection of the torch heap) before the process ends."""
    from console.logs import setup_logging
    from peer.worker import _serve

    set_parent_death_signal()
    setup_logging()
    log = logging.getLogger(f"peer.worker{spec.rank}")
    try:
        _serve(spec, conn, shared, log)
    except (EOFError, KeyboardInterrupt):
        pass
    except Exception as e:
        log.error(f"worker {spec.rank} failed: {e}\n{traceback.format_exc()}")


def _one_trial(variant: str) -> float:
    import peer.worker
    import peer.worker_pool
    from peer.worker_protocol import Compute
    from tests.peer.spawned_pool import spawned_pool

    peer.worker_pool.worker_main = worker_with_teardown if variant == "teardown" else peer.worker.worker_main
    options = {"seed": 3, "batch_size": 16, "num_subnets": 2, "width_mult": 0.25, "head_channels": 64}
    with spawned_pool(options, 3, "bench") as (pool, _params):
        pool.start_compute(Compute(round_index=0, mode="data", cohort_rank=0, num_cohorts=1))
        pool.raise_stop_flag()
        host = None
        deadline = time.monotonic() + 300
        while host is None and time.monotonic() < deadline:
            host = pool.computed(timeout=0.25)
        if host is None:
            raise SystemExit("the worker computed nothing within 300 s")
        pool.apply(0, [t / host.samples for t in pool.host_numerator()])
        started = time.monotonic()
        pool.stop()
        seconds = time.monotonic() - started
        killed = any(proc.exitcode == -9 for proc, _ in pool._workers)
    return seconds if not killed else float("inf")


def _spin() -> None:
    while True:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--busy", type=int, default=0, help="busy loops beside the trials")
    args = parser.parse_args()
    spinners = [
        multiprocessing.get_context("fork").Process(target=_spin, daemon=True) for _ in range(args.busy)
    ]
    for spinner in spinners:
        spinner.start()
    os.environ.setdefault("MANTA_WORKER_THREADS", "1")
    print(f"command: python -m benchmarks.worker_exit {shlex.join(sys.argv[1:])}")
    print(f"machine: {os.cpu_count()} cores, load {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    results: dict[str, list[float]] = {"teardown": [], "os._exit": []}
    for trial in range(args.trials):
        for variant in results:  # interleaved: a change in the machine's load hits both alike
            results[variant].append(_one_trial(variant))
            print(f"  trial {trial + 1}/{args.trials} {variant}: {results[variant][-1]:.2f} s", flush=True)
    before, after = (statistics.median(results[v]) for v in results)
    print("\n| worker ends by | stop() seconds, median | max | killed at the 10 s grace |")
    print("|---|---:|---:|---:|")
    for variant, seconds in results.items():
        finite = [s for s in seconds if s != float("inf")]
        print(
            f"| {variant} | {statistics.median(seconds):.2f} | {max(finite, default=float('nan')):.2f} "
            f"| {len(seconds) - len(finite)} of {len(seconds)} |"
        )
    print(f"\nratio (teardown / os._exit, medians): {before / after:.1f}x")
    print(f"load after: {' '.join(f'{x:.2f}' for x in os.getloadavg())} ({args.busy} busy loop(s) beside)")
    for spinner in spinners:
        spinner.kill()
        spinner.join(5)


if __name__ == "__main__":
    main()
