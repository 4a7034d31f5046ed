"""One contribution's gradient and sketch, computed the same way by the peer that does the work and by
the aggregator that replays it in a spot audit.

These are the steps a receipt commits to: a worker's deterministic sample stream
(:class:`tasks.sharding.SampleStream`) with its augmentation seed, mini-batch after mini-batch through
the round's sub-networks, per-sample gradient sums, and the sketch of the mean gradient
(:mod:`supernet.sketch`). They used to be written out twice (``peer/worker.py`` and
``aggregator/audits.py``): if the two copies drift, honest peers get revoked. Now there is one.

The random draws (augmentation, dropout) come from one ``torch.Generator`` that
:func:`compute_contribution` seeds from :func:`tasks.sharding.augmentation_seed` and passes down,
never from torch's global generator: a spot audit replaying a peer's gradient in one thread of the
aggregator gets the same numbers whatever other threads draw meanwhile.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

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
) -> WorkerContribution:
    """Mini-batches of ``participant``'s stream for ``round_index`` while ``go_on(samples so far)``
    (at least one). ``on_batch(samples, loss_sum, macs)`` after each, for progress reports.

    The mini-batches' augmentation and dropout are drawn from a generator of this call's own, seeded
    by ``(task_seed, round_index, participant)``: the peer and its auditor draw the same, in any
    thread."""
    params = list(net.parameters())
    generator = torch.Generator().manual_seed(augmentation_seed(task_seed, round_index, participant))
    stream = SampleStream(len(workload.task.train_set), task_seed, round_index, participant)
    numerator = [torch.zeros_like(p) for p in params]
    loss_sum, samples, macs = 0.0, 0, 0
    started = time.perf_counter()
    while samples == 0 or go_on(samples):
        indices = stream.take(workload.cfg.batch_size)
        batch = workload.batch(indices, generator)
        stats = workload.accumulate(net, batch, configs, device, generator)
        for acc, p in zip(numerator, params):
            acc.add_(p.grad, alpha=len(indices))  # the batch's per-sample gradient sum
        loss_sum += stats["loss"] * len(indices)
        samples += len(indices)
        macs += stats.get("train_macs", 0)
        if on_batch is not None:
            on_batch(samples, loss_sum, macs)
    return WorkerContribution(numerator, samples, loss_sum, macs, time.perf_counter() - started)


def contribution_sketch(
    numerator: Sequence[torch.Tensor], samples: int, task_seed: int, round_index: int, k: int = SKETCH_SIZE
) -> list[float]:
    """The sketch of the mean gradient ``numerator / samples`` (ValueError if it is not finite)."""
    mean = [n / max(1, samples) for n in numerator]
    return gradient_sketch(mean, sketch_seed(task_seed, round_index), k=k)
