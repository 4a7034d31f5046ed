"""What a receipt's work is worth, derived by the aggregator from the task, never taken from the claim.

The sub-networks of a round are a function of the task's seed and the round (the sandwich rule of
:func:`supernet.training.schedule.step_configs`), and in model-parallel rounds of the cohort's rank
among the round's cohorts (:func:`supernet.training.schedule.cohort_configs`). Their training FLOPs
per sample are a function of the sub-networks
(:func:`supernet.training.gradients.sandwich_flops_per_sample`). So a receipt may name them
(``subnet_hashes``, ``cohort_rank``, ``num_cohorts``) but not price them: a receipt whose sub-networks
are not the ones derived for its round and cohort, or whose ``flops_per_sample`` is not their price,
is refused as mispriced. Credit is then ``samples x derived FLOPs``, and samples are
what the group committed (:mod:`aggregator.contribution_checks`) and the audits replay.

Deriving is cheap (no forward pass: FLOPs are counted analytically) and cached per (round, rank,
cohorts): one round's receipts share one derivation.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

from protocol.records import ContributionReceipt
from protocol.sealing import RejectReason
from supernet.training.gradients import sandwich_flops_per_sample
from supernet.training.schedule import cohort_configs, step_configs

CACHED = 256  # derivations kept: a few per round across the round window


@dataclass(frozen=True)
class PricedWork:
    """The sub-networks a (round, cohort) trains and what one sample of them costs."""

    subnet_hashes: tuple[str, ...]  # unique, in training order (what a receipt lists)
    flops_per_sample: int


class WorkPricing:
    """Derives :class:`PricedWork` for a task's rounds (thread-safe: the cache has a lock)."""

    def __init__(self, workload, mode: str):
        self.workload, self.mode = workload, mode
        self._net = None
        self._cache: OrderedDict[tuple[int, int, int], PricedWork] = OrderedDict()
        self._lock = threading.Lock()  # guards _net and _cache

    def price(self, round_index: int, cohort_rank: int = 0, num_cohorts: int = 1) -> PricedWork:
        """The work of cohort ``cohort_rank`` of ``num_cohorts`` in ``round_index`` (data-parallel
        tasks: every cohort trains the round's sub-networks, whatever its rank)."""
        if self.mode != "model":
            cohort_rank, num_cohorts = 0, 1
        key = (round_index, cohort_rank, num_cohorts)
        with self._lock:
            known = self._cache.get(key)
            if known is not None:
                self._cache.move_to_end(key)
                return known
            if self._net is None:
                self._net = self.workload.build()
            net, cfg = self._net, self.workload.cfg
            if self.mode == "model":
                configs, _scale = cohort_configs(net, round_index, cfg, cohort_rank, num_cohorts)
            else:
                configs = step_configs(net, round_index, cfg)
            flops = sandwich_flops_per_sample(net, configs, cfg, self.workload.input_size)
            priced = PricedWork(tuple(dict.fromkeys(c.hash for c in configs)), max(1, flops))
            self._cache[key] = priced
            while len(self._cache) > CACHED:
                self._cache.popitem(last=False)
            return priced

    def check(self, receipt: ContributionReceipt) -> tuple[RejectReason, str] | None:
        """None if the receipt names the derived sub-networks at their derived price, else why not."""
        try:
            priced = self.price(receipt.round, receipt.cohort_rank, receipt.num_cohorts)
        except ValueError as e:
            return RejectReason.MISPRICED, f"no sub-networks derive for its round and cohort ({e})"
        if tuple(receipt.subnet_hashes) != priced.subnet_hashes:
            return RejectReason.MISPRICED, (
                f"it names {len(receipt.subnet_hashes)} sub-network(s) that are not the "
                f"{len(priced.subnet_hashes)} of round {receipt.round} for its cohort"
            )
        if receipt.flops_per_sample != priced.flops_per_sample:
            return RejectReason.MISPRICED, (
                f"it prices a sample at {receipt.flops_per_sample} FLOPs; its sub-networks cost "
                f"{priced.flops_per_sample}"
            )
        return None
