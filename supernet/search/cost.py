"""What a budget limits: FLOPs (multiply-adds) or predicted latency, and the feasibility check.

A cost model is cheap to call (an analytic count or a table sum), so the search can test every
candidate against the budget before spending an accuracy evaluation on it. Each one also knows its
cheapest sub-network; a budget below that one's cost is infeasible and is reported as such at once,
before any search (:func:`check_budget`), which is also what guarantees that repairing a candidate
towards the cheapest sub-network always ends inside the budget.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Protocol

from torch import nn

from supernet.config import SearchSpace, SubnetConfig
from supernet.search.latency import LatencyTable, unit_shapes
from supernet.search.timing import example_inputs
from supernet.stereo.model import StereoSupernet

__all__ = ["CostModel", "FlopsCost", "InfeasibleBudget", "LatencyCost", "check_budget"]


class InfeasibleBudget(ValueError):
    """No sub-network fits the budget (one line giving the cheapest sub-network's cost)."""


class CostModel(Protocol):
    """``cost(cfg)`` in :attr:`unit`; :meth:`cheapest` is a sub-network of minimal cost."""

    name: str  # "mflops" | "latency_ms"
    unit: str  # "MFLOPs" | "ms"

    def __call__(self, cfg: SubnetConfig) -> float: ...

    def cheapest(self) -> SubnetConfig: ...


class FlopsCost:
    """Millions of multiply-adds of one forward pass at the task's input size (what ``net.flops`` counts).

    The search prices thousands of candidates, and ``net.flops`` walks every layer each time; the count
    is a sum over blocks (block shapes do not depend on the sub-network), so it is tabulated once per
    block choice, like the latency table, and checked against ``net.flops`` on a few sub-networks
    (falling back to ``net.flops`` if they ever disagreed).
    """

    name = "mflops"
    unit = "MFLOPs"

    def __init__(self, net: nn.Module, input_size: Sequence[int]) -> None:
        self.net = net
        self.input_size = tuple(input_size)
        self.blocks, self.fixed = _flops_table(net, self.input_size)
        rng = random.Random(0)
        probes = [net.largest_config(), net.smallest_config(), *(net.space.sample(rng) for _ in range(3))]
        self.exact = any(self._tabulated(c) != net.flops(c, self.input_size) for c in probes)

    def _tabulated(self, cfg: SubnetConfig) -> int:
        return self.fixed + sum(self.blocks[(u, min(b, 1), k, e)] for u, b, k, e in cfg.blocks())

    def __call__(self, cfg: SubnetConfig) -> float:
        macs = self.net.flops(cfg, self.input_size) if self.exact else self._tabulated(cfg)
        return macs / 1e6

    def cheapest(self) -> SubnetConfig:
        # Multiply-adds grow with every choice (kernel, expand ratio, depth), so the smallest is cheapest.
        return self.net.smallest_config()


def _flops_table(net: nn.Module, input_size: tuple[int, ...]) -> tuple[dict[tuple, int], int]:
    """Multiply-adds of every (unit, first/later block, kernel, expand) and of the fixed rest."""

    family = "stereo" if isinstance(net, StereoSupernet) else "classification"
    if family == "classification" and len(input_size) == 2:
        input_size = (net.in_channels, *input_size)
    device = next(net.parameters()).device
    shapes = unit_shapes(net, example_inputs(family, input_size, device))
    space = net.space
    blocks = {}
    for u, unit in enumerate(net.units):
        for b in (0, 1) if space.max_depth > 1 else (0,):
            shape = shapes[u][0] if b == 0 else shapes[u][1]
            for k in space.kernel_sizes:
                for e in space.expand_ratios:
                    # shape[0]: the siamese stereo encoder runs each block on both images
                    blocks[(u, b, k, e)] = shape[0] * unit.blocks[b].macs(k, e, tuple(shape[-2:]))[0]
    largest = space.largest()
    fixed = net.flops(largest, input_size) - sum(
        blocks[(u, min(b, 1), k, e)] for u, b, k, e in largest.blocks()
    )
    return blocks, fixed


class LatencyCost:
    """Predicted latency in ms from a measured :class:`LatencyTable`."""

    name = "latency_ms"
    unit = "ms"

    def __init__(self, table: LatencyTable, space: SearchSpace) -> None:
        self.table = table
        self.space = space

    def __call__(self, cfg: SubnetConfig) -> float:
        return self.table.predict(cfg)

    def cheapest(self) -> SubnetConfig:
        return self.table.cheapest(self.space)


def check_budget(cost: CostModel, limit: float, flag: str | None = None) -> SubnetConfig:
    """The cheapest sub-network if ``limit`` admits it, else :class:`InfeasibleBudget`.

    ``flag`` names the option in the message (e.g. ``--max-mflops``).
    """
    flag = flag or cost.name
    if not isinstance(limit, (int, float)) or not math.isfinite(limit) or limit <= 0:
        raise InfeasibleBudget(f"{flag}: the budget must be a positive number, got {limit!r}")
    cheapest = cost.cheapest()
    floor = cost(cheapest)
    if floor > limit:
        raise InfeasibleBudget(
            f"{flag} {limit:g}: infeasible budget, below the smallest sub-network's {floor:.4g} {cost.unit}"
        )
    return cheapest
