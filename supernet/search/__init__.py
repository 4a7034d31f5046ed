"""Sub-network search under latency or FLOPs budgets, and export (``manta-search``).

* :mod:`~supernet.search.latency` — measured per-device latency lookup tables (JSON, reused).
* :mod:`~supernet.search.cost` — FLOPs and latency cost models, the infeasible-budget check.
* :mod:`~supernet.search.accuracy` — the evaluator interface; direct evaluation after BN recalibration.
* :mod:`~supernet.search.predictor` — an MLP accuracy predictor for large spaces.
* :mod:`~supernet.search.evolution` — evolutionary search and the random-search baseline.
* :mod:`~supernet.search.distributed` — splitting evaluations over helpers, deterministic merge.
* :mod:`~supernet.search.pareto` — the Pareto front as a table and a PNG plot.
* :mod:`~supernet.search.deploy` — export of the chosen sub-network (TorchScript + config JSON).
* :mod:`~supernet.search.run` / :mod:`~supernet.search.cli` — the whole job and its command line.
"""

from supernet.search.accuracy import DirectEvaluator, Evaluator
from supernet.search.cost import FlopsCost, InfeasibleBudget, LatencyCost, check_budget
from supernet.search.distributed import DistributedEvaluator, answer_share, merge_results, split_work
from supernet.search.evolution import (
    Candidate,
    EvolutionSettings,
    SearchResult,
    evolutionary_search,
    random_search,
)
from supernet.search.latency import LatencyTable, build_latency_table, load_or_build
from supernet.search.pareto import pareto_front

__all__ = [
    "Candidate",
    "DirectEvaluator",
    "DistributedEvaluator",
    "Evaluator",
    "EvolutionSettings",
    "FlopsCost",
    "InfeasibleBudget",
    "LatencyCost",
    "LatencyTable",
    "SearchResult",
    "answer_share",
    "build_latency_table",
    "check_budget",
    "evolutionary_search",
    "load_or_build",
    "merge_results",
    "pareto_front",
    "random_search",
    "split_work",
]
