"""Run in a fresh interpreter (``python -m tests.peer.fork_or_spawn``): one CPU worker forked before
the first thread and one spawned, each computing the same round on the same state; prints JSON with
both gradient digests, each worker's private memory after the round, and how a second forked process,
never taken, ended at the close."""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time

from hivemind_adapter.runtime import prepare_process

prepare_process()

from peer.devices import WorkerDevice  # noqa: E402  (after prepare_process, as manta-peer join does)
from peer.worker_fork import WaitingWorkers  # noqa: E402
from peer.worker_protocol import Compute  # noqa: E402
from tests.peer.spawned_pool import spawned_pool  # noqa: E402

OPTIONS = {"seed": 3, "batch_size": 16, "num_subnets": 2, "width_mult": 0.25, "head_channels": 64}
DEVICE = WorkerDevice("cpu", 0, "test cpu", 1024)


def _private_mib(pid: int) -> float:
    with open(f"/proc/{pid}/smaps_rollup") as rollup:
        fields = dict(line.split()[:2] for line in rollup if line.split()[0].endswith(":"))
    return (int(fields["Private_Clean:"]) + int(fields["Private_Dirty:"])) / 1024


def _round(waiting: WaitingWorkers | None) -> dict:
    with spawned_pool(OPTIONS, 3, "fork-or-spawn", threads=1, waiting=waiting) as (pool, _):
        pool.load(pool.shared.state)
        pool.start_compute(Compute(round_index=0, mode="data", cohort_rank=0, num_cohorts=1))
        pool.raise_stop_flag()  # one mini-batch
        while (host := pool.computed(timeout=1.0)) is None:
            pass
        digest = hashlib.sha256(b"".join(t.numpy().tobytes() for t in pool.host_numerator())).hexdigest()
        pid = pool._workers[0][0].pid
        return {"pid": pid, "samples": host.samples, "digest": digest, "private_mib": _private_mib(pid)}


def main() -> None:
    waiting = WaitingWorkers.fork_for([DEVICE, DEVICE])
    if waiting is None:
        sys.exit("error: nothing was forked")
    spare = waiting._waiting[1][0]  # the pool takes the first
    try:
        forked = _round(waiting)
    finally:
        began = time.monotonic()
        waiting.close()
    closed = {"exitcode": spare.exitcode, "seconds": time.monotonic() - began}
    spawned = _round(None)
    print(json.dumps({"agent": os.getpid(), "forked": forked, "spawned": spawned, "spare": closed}))


if __name__ == "__main__":
    main()
