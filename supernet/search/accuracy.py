"""Accuracy estimation for the search: the evaluator interface and direct evaluation.

An evaluator maps sub-network configs to the task metric (accuracy, or EPE for stereo), keyed by
config hash. :class:`DirectEvaluator` measures it: BN recalibration for the sub-network (fixed
training batches, :meth:`Workload.evaluate`), then the metric on a fixed validation subset. The value
depends only on the checkpoint and the config — not on which process evaluates it, nor on what it
evaluated before (recalibration resets the statistics) — which is what lets helpers share the work
(:mod:`supernet.search.distributed`) without changing the result. For large spaces or expensive
tasks, :class:`supernet.search.predictor.PredictorEvaluator` estimates it instead.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Sequence
from typing import Any, Protocol

from torch import nn
from torch.utils.data import Subset

from supernet.config import SubnetConfig, derive_seed
from supernet.workload import Workload

__all__ = ["DirectEvaluator", "Evaluator", "check_results"]


class Evaluator(Protocol):
    """Anything that gives the task metric of sub-networks: ``{config.hash: value}`` for ``configs``."""

    def evaluate(self, configs: Sequence[SubnetConfig]) -> dict[str, float]: ...


def check_results(configs: Sequence[SubnetConfig], results: dict[str, float], who: str = "evaluator") -> None:
    """Raise ``ValueError`` unless ``results`` has a finite value for exactly the hashes of ``configs``."""
    expected = {c.hash for c in configs}
    got = set(results)
    if got != expected:
        missing, extra = sorted(expected - got), sorted(got - expected)
        raise ValueError(
            f"{who}: results for the wrong configs (missing {missing[:3]}, unexpected {extra[:3]})"
        )
    for key, value in results.items():
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"{who}: result for {key[:12]} is not a finite number: {value!r}")


class DirectEvaluator:
    """Measure the metric of each config after BN recalibration, on a fixed validation subset.

    ``val_samples``: how many validation samples (default: all); the subset is drawn once from
    ``seed`` and is the same for every config and every process. ``bn_batches`` overrides the
    checkpoint's ``bn_calibration_batches``. ``net`` is the loaded supernet (its BN statistics are
    overwritten by each evaluation; parameters are not touched).
    """

    def __init__(
        self,
        workload: Workload,
        net: nn.Module,
        *,
        val_samples: int | None = None,
        bn_batches: int | None = None,
        seed: int = 0,
    ) -> None:
        task = workload.task
        total = len(task.val_set)
        if val_samples is not None and val_samples < 1:
            raise ValueError(f"val_samples: need at least 1, got {val_samples}")
        if val_samples is None or val_samples >= total:
            val_set = task.val_set
            self.val_indices = list(range(total))
        else:
            rng = random.Random(derive_seed("search-validation", seed))
            self.val_indices = sorted(rng.sample(range(total), val_samples))
            val_set = Subset(task.val_set, self.val_indices)
        cfg = workload.cfg
        if bn_batches is not None:
            cfg = dataclasses.replace(cfg, bn_calibration_batches=int(bn_batches))
        self.workload = Workload(workload.family, cfg, dataclasses.replace(task, val_set=val_set))
        self.net = net
        self.metric_name = workload.metric_name
        self.higher_is_better = workload.higher_is_better
        self.count = 0  # evaluations done (for reports)

    @property
    def val_samples(self) -> int:
        return len(self.val_indices)

    @property
    def settings(self) -> dict[str, Any]:
        """What a value depends on besides the config and the weights: helpers must agree on it."""
        return {
            "task": self.workload.cfg.task,
            "val_indices": derive_seed("val-indices", *self.val_indices),
            "val_samples": self.val_samples,
            "bn_calibration_batches": self.workload.cfg.bn_calibration_batches,
            "seed": self.workload.cfg.seed,
        }

    def evaluate(self, configs: Sequence[SubnetConfig]) -> dict[str, float]:
        out: dict[str, float] = {}
        for cfg in configs:
            rows = self.workload.evaluate(self.net, {cfg.hash: cfg})
            out[cfg.hash] = float(rows[0][self.metric_name])
            self.count += 1
        return out
