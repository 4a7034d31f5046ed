"""Sub-network search under latency or FLOPs budgets, and export (``manta-search``).

* :mod:`~supernet.search.latency` — measured per-device latency lookup tables (JSON, reused).
* :mod:`~supernet.search.cost` — FLOPs and latency cost models, the infeasible-budget check.
* :mod:`~supernet.search.accuracy` — the evaluator interface; direct evaluation after BN recalibration.
* :mod:`~supernet.search.predictor` — an MLP accuracy predictor for large spaces.
* :mod:`~supernet.search.evolution` — evolutionary search and the random-search baseline.
* :mod:`~supernet.search.distributed` — splitting evaluations over helpers, deterministic merge.
* :mod:`~supernet.search.pareto` — the Pareto front as a table and a PNG plot.
* :mod:`~supernet.search.deploy` — export of the chosen sub-network (TorchScript + config JSON).
* :mod:`~supernet.search.run` / :mod:`~supernet.search.cli` — the whole job and its command line;
  :mod:`~supernet.search.options` — that command line's options (click only, no torch).

The names below are imported when first used (see :mod:`supernet.lazy_exports`).
"""

from supernet.lazy_exports import lazy_exports

_EXPORTS = {
    "Candidate": "supernet.search.evolution",
    "DirectEvaluator": "supernet.search.accuracy",
    "DistributedEvaluator": "supernet.search.distributed",
    "Evaluator": "supernet.search.accuracy",
    "EvolutionSettings": "supernet.search.evolution",
    "FlopsCost": "supernet.search.cost",
    "InfeasibleBudget": "supernet.search.cost",
    "LatencyCost": "supernet.search.cost",
    "LatencyTable": "supernet.search.latency",
    "SearchResult": "supernet.search.evolution",
    "answer_share": "supernet.search.distributed",
    "build_latency_table": "supernet.search.latency",
    "check_budget": "supernet.search.cost",
    "evolutionary_search": "supernet.search.evolution",
    "load_or_build": "supernet.search.latency",
    "merge_results": "supernet.search.distributed",
    "pareto_front": "supernet.search.pareto",
    "random_search": "supernet.search.evolution",
    "split_work": "supernet.search.distributed",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
