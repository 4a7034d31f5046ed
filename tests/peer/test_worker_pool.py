"""The worker pool with a real spawned CPU worker: a round's computation through the typed protocol,
the shared progress it reports, and a worker killed mid-round surfacing as ``WorkerDied`` (which the
CLI turns into one line) instead of a pipe error or a hang."""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch

from peer.worker import WorkerLimits
from peer.worker_pool import WorkerDied, WorkerPool
from peer.worker_protocol import Compute, HostContribution
from tests.peer.spawned_pool import spawned_pool

OPTIONS = {"seed": 3, "batch_size": 16, "num_subnets": 2, "width_mult": 0.25, "head_channels": 64}


@pytest.fixture
def pool(monkeypatch):
    monkeypatch.setenv("MANTA_WORKER_THREADS", "1")
    with spawned_pool(OPTIONS, 3, "peer-test") as (pool, _params):
        yield pool


def _computed(pool: WorkerPool, timeout: float) -> HostContribution:
    deadline = time.monotonic() + timeout
    while (host := pool.computed(timeout=0.25)) is None:
        assert time.monotonic() < deadline, "the worker did not finish its mini-batch"
    return host


def test_a_round_computes_applies_and_a_killed_worker_is_reported(pool):
    pool.start_compute(Compute(round_index=0, mode="data", cohort_rank=0, num_cohorts=1))
    pool.raise_stop_flag()  # at least one mini-batch is always processed
    host = _computed(pool, 120)
    assert host.samples == OPTIONS["batch_size"] == sum(pool.worker_samples())
    assert len(host.config_hashes) == OPTIONS["num_subnets"] and host.loss > 0
    numerator = pool.host_numerator()
    assert any(bool(t.abs().sum() > 0) for t in numerator) and all(
        bool(torch.isfinite(t).all()) for t in numerator
    )
    before = [t.clone() for t in pool.shared.state]
    assert (
        pool.apply(0, [t / host.samples for t in numerator]) is not None
    )  # a learning rate: a step was taken
    assert any(not torch.equal(a, b) for a, b in zip(before, pool.shared.state))

    pool.start_compute(Compute(round_index=1, mode="data", cohort_rank=0, num_cohorts=1))
    proc = pool._workers[0][0]
    os.kill(proc.pid, signal.SIGKILL)
    with pytest.raises(WorkerDied, match="worker"):
        _computed(pool, 60)


def test_a_worker_stopped_in_the_middle_of_a_round_leaves_by_itself_instead_of_being_killed(monkeypatch):
    """A peer that lost its swarm mid-round (or a second Ctrl-C) stops its pool while the worker still
    computes: the worker finishes its mini-batch and leaves. Before, nothing told it to stop
    computing, and it was killed at the end of the pool's grace."""
    monkeypatch.setenv("MANTA_WORKER_THREADS", "1")
    with spawned_pool(OPTIONS, 3, "peer-test") as (pool, _params):
        pool.start_compute(Compute(round_index=0, mode="data", cohort_rank=0, num_cohorts=1))
        time.sleep(1.0)
        pool.stop()
        proc = pool._workers[0][0]
        assert not proc.is_alive()
        assert proc.exitcode == 0, f"the worker was killed (exit code {proc.exitcode})"


def _busy_share(pool: WorkerPool, seconds: float) -> float:
    """The worker's CPU time over the wall time of ``seconds`` of computing (one torch thread)."""
    import psutil

    worker = psutil.Process(pool._workers[0][0].pid)
    pool.start_compute(Compute(round_index=0, mode="data", cohort_rank=0, num_cohorts=1))
    time.sleep(5.0)  # past the first mini-batch's start-up
    before, started = worker.cpu_times(), time.monotonic()
    time.sleep(seconds)
    after, wall = worker.cpu_times(), time.monotonic() - started
    pool.raise_stop_flag()
    _computed(pool, 120)
    return (after.user + after.system - before.user - before.system) / wall


# Slow (27 s; make test-all): it times two spawned pools. No default test covers --cpu-share.
@pytest.mark.slow
@pytest.mark.exclusive  # measures a CPU share: nothing else may run beside it
def test_a_worker_lent_a_third_of_the_cpu_computes_about_a_third_of_the_time():
    """``--cpu-share``: after each mini-batch the worker rests twice as long as it took."""
    with spawned_pool(OPTIONS, 3, "share-full", threads=1) as (full, _):
        whole = _busy_share(full, 8.0)
    with spawned_pool(OPTIONS, 3, "share-third", threads=1, limits=WorkerLimits(cpu_share=1 / 3)) as (
        lent,
        _,
    ):
        third = _busy_share(lent, 8.0)
    assert whole > 0.6, whole  # one thread, computing all the time
    assert third < 0.55 * whole, (whole, third)
