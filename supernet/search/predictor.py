"""An accuracy predictor for large search spaces: a small MLP on a one-hot encoding of the config.

Direct evaluation costs a BN recalibration and a validation pass per candidate; on a large task that
limits a search to a few hundred candidates. The predictor is trained once on directly evaluated
sub-networks (random ones, so it sees the whole space) and then scores candidates in microseconds.
Its error is reported as the RMSE on held-out configs next to the RMSE of always predicting the mean,
so a reader sees whether it learned anything.

Encoding, per unit: the depth one-hot, then for every block slot up to the maximal depth the kernel
size one-hot and the expand ratio one-hot (all zeros for blocks beyond the unit's depth).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from supernet.config import SearchSpace, SubnetConfig, derive_seed
from supernet.init import build_initialised, reset_torch_defaults

__all__ = ["AccuracyPredictor", "PredictorEvaluator", "encode", "fit_with_holdout"]


def encode(cfg: SubnetConfig, space: SearchSpace) -> list[float]:
    """The one-hot feature vector of ``cfg`` (length ``units × (D + maxD × (K + E))``)."""
    space.validate(cfg)
    K, E, D = space.kernel_sizes, space.expand_ratios, space.depths
    out: list[float] = []
    for u in range(space.num_units):
        out += [1.0 if cfg.depths[u] == d else 0.0 for d in D]
        for b in range(space.max_depth):
            active = b < cfg.depths[u]
            out += [1.0 if active and cfg.kernel_sizes[u][b] == k else 0.0 for k in K]
            out += [1.0 if active and cfg.expand_ratios[u][b] == e else 0.0 for e in E]
    return out


class AccuracyPredictor:
    """MLP (``layers`` hidden layers of ``hidden`` units, ReLU) regressing the metric from the encoding.

    Targets are standardised for training; training is full-batch AdamW from initial weights drawn
    from a generator seeded by ``seed`` (torch's global generator is not used: a search may run in a
    thread beside others), so the same data gives the same predictor.
    """

    def __init__(self, space: SearchSpace, hidden: int = 128, layers: int = 2, seed: int = 0) -> None:
        self.space = space
        dim = len(encode(space.largest(), space))

        def mlp() -> nn.Sequential:
            modules: list[nn.Module] = []
            width = dim
            for _ in range(layers):
                modules += [nn.Linear(width, hidden), nn.ReLU()]
                width = hidden
            modules.append(nn.Linear(width, 1))
            return nn.Sequential(*modules)

        generator = torch.Generator().manual_seed(derive_seed("predictor", seed) % (2**63))
        self.model = build_initialised(mlp, generator, reset_torch_defaults)
        self.mean, self.std = 0.0, 1.0
        self.seed = seed

    def _features(self, configs: Sequence[SubnetConfig]) -> torch.Tensor:
        return torch.tensor([encode(c, self.space) for c in configs], dtype=torch.float32)

    def fit(
        self,
        configs: Sequence[SubnetConfig],
        values: Sequence[float],
        *,
        epochs: int = 800,
        lr: float = 3e-3,
        weight_decay: float = 1e-3,
    ) -> AccuracyPredictor:
        if len(configs) != len(values) or len(configs) < 2:
            raise ValueError(f"fit: need at least 2 (config, value) pairs, got {len(configs)}/{len(values)}")
        x = self._features(configs)
        y = torch.tensor(values, dtype=torch.float32)
        self.mean = float(y.mean())
        self.std = float(y.std()) if float(y.std()) > 0 else 1.0
        target = ((y - self.mean) / self.std).unsqueeze(1)
        optimizer = torch.optim.AdamW(self.model.parameters(), lr=lr, weight_decay=weight_decay)
        self.model.train()
        for _ in range(epochs):
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(self.model(x), target)
            loss.backward()
            optimizer.step()
        self.model.eval()
        return self

    @torch.no_grad()
    def predict(self, configs: Sequence[SubnetConfig]) -> list[float]:
        if not configs:
            return []
        out = self.model(self._features(configs)).squeeze(1) * self.std + self.mean
        return [float(v) for v in out]

    def rmse(self, configs: Sequence[SubnetConfig], values: Sequence[float]) -> float:
        predicted = self.predict(configs)
        return math.sqrt(sum((p - v) ** 2 for p, v in zip(predicted, values, strict=True)) / len(values))


class PredictorEvaluator:
    """The :class:`~supernet.search.accuracy.Evaluator` interface over a trained predictor."""

    def __init__(self, predictor: AccuracyPredictor) -> None:
        self.predictor = predictor
        self.count = 0

    def evaluate(self, configs: Sequence[SubnetConfig]) -> dict[str, float]:
        self.count += len(configs)
        return {c.hash: v for c, v in zip(configs, self.predictor.predict(configs), strict=True)}


def fit_with_holdout(
    space: SearchSpace,
    configs: Sequence[SubnetConfig],
    values: Sequence[float],
    *,
    holdout: float = 0.2,
    seed: int = 0,
    **fit_options: Any,
) -> tuple[AccuracyPredictor, dict[str, Any]]:
    """Train on a seeded ``1 - holdout`` share, report RMSE on the rest; returns (predictor, report).

    The report has ``rmse`` (held out), ``mean_rmse`` (held out, predicting the training mean),
    ``train_rmse``, ``n_train`` and ``n_test``.
    """
    if not 0 < holdout < 1:
        raise ValueError(f"holdout: {holdout} is not between 0 and 1")
    order = list(range(len(configs)))
    random.Random(derive_seed("predictor-split", seed)).shuffle(order)
    n_test = max(1, round(holdout * len(order)))
    test, train = order[:n_test], order[n_test:]
    if len(train) < 2:
        raise ValueError(f"fit_with_holdout: {len(configs)} samples are too few to hold {n_test} out")
    train_c, train_v = [configs[i] for i in train], [values[i] for i in train]
    test_c, test_v = [configs[i] for i in test], [values[i] for i in test]
    predictor = AccuracyPredictor(space, seed=seed).fit(train_c, train_v, **fit_options)
    mean = sum(train_v) / len(train_v)
    report = {
        "rmse": predictor.rmse(test_c, test_v),
        "mean_rmse": math.sqrt(sum((mean - v) ** 2 for v in test_v) / len(test_v)),
        "train_rmse": predictor.rmse(train_c, train_v),
        "n_train": len(train),
        "n_test": len(test),
    }
    return predictor, report
