"""Spot audits: recompute a peer's gradient and compare it with what its receipt committed to.

A receipt names everything needed to redo the work: the state it started from (``state_digest``),
the round, the sub-networks (``subnet_hashes``), and how many samples each of its workers took
(``worker_samples``) from its deterministic stream (:class:`tasks.sharding.SampleStream`, mini-batch
by mini-batch, with the augmentation seed of :func:`tasks.sharding.augmentation_seed`). The auditor
loads that state, replays the same mini-batches through the same sub-networks, and projects the mean
gradient exactly as the peer did (:mod:`supernet.sketch`).

Honest peers differ from the replay only by float32 rounding, but that is not small: the gradients of
convolutions under batch-norm are sums that cancel heavily, and their rounding depends on the thread
count and the hardware. Measured here (``benchmarks/audit_noise.py``) an honest distance is typically
0.002-0.02 with a tail past 0.05; a gradient rescaled by 10 % lies at 0.1, a made-up one near 1. So
a distance up to :data:`PASS_WITHIN` passes, one beyond :data:`FAIL_BEYOND` fails, and one between is
*marginal*: proof of nothing on its own, it is the desk's to weigh against the key's next audits.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import torch

from protocol.records import ContributionReceipt
from supernet.config import SubnetConfig
from supernet.contribution import compute_contribution, contribution_sketch
from supernet.sketch import decode_sketch, sketch_distance
from supernet.state import init_optimizer_state, load_state_tensors
from supernet.training.schedule import cohort_configs, step_configs
from supernet.workload import Workload
from tasks.shard_assignment import sample_pool

PASS_WITHIN = 0.05  # relative L2 distance of the sketches up to which an audit passes
FAIL_BEYOND = 0.25  # ... beyond which it fails; between the two it is marginal


class Verdict(StrEnum):
    PASSED = "passed"
    MARGINAL = "marginal"  # above honest rounding's usual reach, below any fabrication's
    FAILED = "failed"
    UNAVAILABLE = "unavailable"  # no copy of the start state: nothing replayed


@dataclass(frozen=True)
class AuditResult:
    verdict: Verdict
    distance: float  # relative sketch distance; inf where nothing could be replayed, nan if unavailable


def verdict_of(distance: float) -> Verdict:
    if distance <= PASS_WITHIN:
        return Verdict.PASSED
    return Verdict.MARGINAL if distance <= FAIL_BEYOND else Verdict.FAILED


def receipt_configs(
    net, receipt: ContributionReceipt, workload: Workload, max_cohorts: int = 16
) -> list[SubnetConfig]:
    """The sub-networks the receipt's hashes name, re-derived from the round (data- or model-parallel
    assignment); ValueError if no assignment produces them."""
    wanted = list(receipt.subnet_hashes)
    candidates = [step_configs(net, receipt.round, workload.cfg)]
    for cohorts in range(2, max_cohorts + 1):
        candidates += [
            cohort_configs(net, receipt.round, workload.cfg, rank, cohorts)[0] for rank in range(cohorts)
        ]
    for configs in candidates:
        unique = list(dict.fromkeys(c.hash for c in configs))
        if unique == wanted:
            return configs
    raise ValueError("no sub-network assignment of this round has the receipt's sub-networks")


def audit_receipt(
    workload: Workload, state: list[torch.Tensor], receipt: ContributionReceipt, task_seed: int
) -> AuditResult:
    """Replay ``receipt``'s work from ``state``: its verdict and relative sketch distance.

    Needs no lock against the aggregator's other threads: the replay's random draws (initialisation,
    the peer's augmentation and dropout) all come from generators it seeds itself
    (:func:`supernet.contribution.compute_contribution`), never from torch's global generator."""
    net = workload.build()
    optimizer = workload.make_optimizer(net)
    init_optimizer_state(net, optimizer)
    load_state_tensors(net, optimizer, state)
    try:
        configs = receipt_configs(net, receipt, workload)
    except ValueError:
        return AuditResult(Verdict.FAILED, float("inf"))  # sub-networks no assignment of the round has
    numerator = [torch.zeros(p.shape, dtype=p.dtype) for p in net.parameters()]
    # a task on shards: the streams drew from the shards the receipt signs (tasks.shard_assignment)
    pool = None
    if receipt.data_shards:
        manifest = workload.task.manifest
        if manifest is None:
            return AuditResult(Verdict.FAILED, float("inf"))  # shards named in a task without them
        try:
            pool = sample_pool(manifest.split("train"), receipt.data_shards)
        except ValueError:
            return AuditResult(Verdict.FAILED, float("inf"))  # a shard that is no training shard
    for worker, count in enumerate(receipt.worker_samples):
        work = compute_contribution(
            workload,
            net,
            configs,
            "cpu",
            task_seed,
            receipt.round,
            f"{receipt.peer_id}/{worker}",
            go_on=lambda samples, count=count: samples < count,
            pool=pool,
        )
        for total, part in zip(numerator, work.numerator):
            total.add_(part)
    recomputed = contribution_sketch(
        numerator, receipt.samples, task_seed, receipt.round, k=len(receipt.grad_sketch)
    )
    distance = sketch_distance(decode_sketch(receipt.grad_sketch), recomputed)
    return AuditResult(verdict_of(distance), distance)
