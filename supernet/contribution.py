"""One contribution's gradient and sketch, computed the same way by the peer that does the work and by
the aggregator that replays it in a spot audit.

These are the steps a receipt commits to: a worker's deterministic sample stream
(:class:`tasks.sharding.SampleStream`) with its augmentation seed, mini-batch after mini-batch through
the round's sub-networks, per-sample gradient sums, and the sketch of the mean gradient
(:mod:`supernet.sketch`). They are written out once, here, for the peer's worker and the aggregator's
audit alike: were two copies to drift, honest peers would be revoked.

The random draws come from two ``torch.Generator`` objects of :func:`compute_contribution`'s own, both
seeded from :func:`tasks.sharding.augmentation_seed`
(:func:`supernet.batch_prefetch.contribution_generators`):
one for the augmentation, one for dropout. Never torch's global generator: a spot audit replaying a
peer's gradient in one thread of the aggregator gets the same numbers whatever other threads draw
meanwhile. Two, not one, because the mini-batches are loaded and augmented ahead of the training step
in background threads (:class:`supernet.batch_prefetch.BatchPrefetcher`): the augmentation draws in
batch order there, dropout in the training step, and neither order depends on how far ahead the
pipeline runs.
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from supernet.batch_prefetch import (
    DEFAULT_DEPTH,
    BatchPrefetcher,
    batch_maker,
    batch_to_device,
    contribution_generators,
    default_decode_threads,
)
from supernet.config import SubnetConfig
from supernet.sketch import SKETCH_SIZE, gradient_sketch, sketch_seed
from supernet.workload import Workload
from tasks.sharding import SampleStream, augmentation_seed


@dataclass
class WorkerContribution:
    """What one worker computed in one round: per-sample gradient sums and their counts."""

    numerator: list[torch.Tensor]  # sum over samples of each parameter's gradient
    samples: int
    loss_sum: float
    macs: int
    seconds: float


def compute_contribution(
    workload: Workload,
    net: torch.nn.Module,
    configs: Sequence[SubnetConfig],
    device: torch.device | str,
    task_seed: int,
    round_index: int,
    participant: str,
    go_on: Callable[[int], bool],
    on_batch: Callable[[int, float, int], None] | None = None,
    *,
    pool: np.ndarray | None = None,
    prefetch: int | None = None,
    decode_threads: int | None = None,
    decode_processes: int | None = None,
) -> WorkerContribution:
    """Mini-batches of ``participant``'s stream for ``round_index`` while ``go_on(samples so far)``
    (at least one). ``on_batch(samples, loss_sum, macs)`` after each, for progress reports. ``pool``:
    the sample indices the stream draws from (:class:`tasks.sharding.SampleStream`; default all).

    The mini-batches' augmentation and dropout are drawn from generators of this call's own, seeded
    by ``(task_seed, round_index, participant)``: the peer and its auditor draw the same, in any
    thread. Up to ``prefetch`` mini-batches are decoded and augmented ahead of the training step in
    the background (:class:`supernet.batch_prefetch.BatchPrefetcher`); ``prefetch=0`` makes them in
    the loop. The result is the same either way. Defaults: on a GPU two batches ahead, decoded in
    ``decode_processes`` forked processes (:func:`~supernet.batch_prefetch.default_decode_threads`)
    where this process may have children (not a daemon), else in the producer thread; on the CPU in
    the loop (``prefetch=0``): there the training step keeps every core busy, and a background
    thread's torch operations only compete with it (benchmarks/RESULTS.md, "Input pipeline (GPU)").
    ``decode_threads`` (default none) decodes in threads instead."""
    params = list(net.parameters())
    augmentation, dropout = contribution_generators(augmentation_seed(task_seed, round_index, participant))
    train_set = workload.task.train_set
    stream = SampleStream(len(train_set), task_seed, round_index, participant, pool=pool)
    batch_size = workload.cfg.batch_size
    on_cuda = torch.device(device).type == "cuda"
    if prefetch is None:
        prefetch = DEFAULT_DEPTH if on_cuda else 0
    if decode_processes is None:
        may_fork = not multiprocessing.current_process().daemon  # a daemon may not have children
        decode_processes = default_decode_threads() if on_cuda and prefetch > 0 and may_fork else 0
    if decode_threads is None:
        decode_threads = 0
    numerator = [torch.zeros_like(p) for p in params]
    loss_sum, samples, macs = 0.0, 0, 0
    started = time.perf_counter()
    with BatchPrefetcher(
        train_set,
        lambda: stream.take(batch_size),
        batch_maker(workload, augmentation),
        depth=prefetch,
        decode_threads=decode_threads,
        processes=decode_processes,
        pin_memory=on_cuda,
    ) as batches:
        for indices, batch in batches:
            if on_cuda:  # from page-locked memory: the copy runs on the stream, ahead of the step
                batch = batch_to_device(batch, device, non_blocking=True)
            stats = workload.accumulate(net, batch, configs, device, dropout)
            for acc, p in zip(numerator, params):
                acc.add_(p.grad, alpha=len(indices))  # the batch's per-sample gradient sum
            loss_sum += stats["loss"] * len(indices)
            samples += len(indices)
            macs += stats.get("train_macs", 0)
            if on_batch is not None:
                on_batch(samples, loss_sum, macs)
            if not go_on(samples):
                break
    return WorkerContribution(numerator, samples, loss_sum, macs, time.perf_counter() - started)


def contribution_sketch(
    numerator: Sequence[torch.Tensor], samples: int, task_seed: int, round_index: int, k: int = SKETCH_SIZE
) -> list[float]:
    """The sketch of the mean gradient ``numerator / samples`` (ValueError if it is not finite)."""
    mean = [n / max(1, samples) for n in numerator]
    return gradient_sketch(mean, sketch_seed(task_seed, round_index), k=k)
