"""One search job from a checkpoint to a shipped sub-network (what ``manta-search`` runs).

Order matters for the user: everything that can be wrong with the input (device, budget options,
checkpoint, task, a budget no sub-network meets) is checked before any long computation, so a
mistake costs seconds, not a search.

Steps: load the checkpoint → latency table for the device (reused or built) → cost model of the
budget and the feasibility check → accuracy estimator (direct, or a predictor trained on directly
evaluated random sub-networks) → evolutionary search (and optionally the random baseline with the
same number of evaluations) → the chosen sub-network evaluated directly on the full validation set,
exported, its latency measured end to end → optional model file (TorchScript, torch.export or ONNX,
by its suffix) + JSON, checked against the supernet's output, plot, latency validation.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from supernet.checkpoint import CheckpointError, LoadedCheckpoint, load_checkpoint, read_checkpoint
from supernet.config import derive_seed
from supernet.export_formats import format_of, load_model
from supernet.search.accuracy import DirectEvaluator, Evaluator
from supernet.search.cost import CostModel, FlopsCost, LatencyCost, check_budget
from supernet.search.deploy import (
    CHECK_SAMPLES,
    check_batch,
    evaluate_model,
    input_description,
    input_names,
    recalibrated_export,
    save_subnet,
    supernet_difference,
)
from supernet.search.distributed import DistributedEvaluator, SpotChecks
from supernet.search.evolution import (
    Candidate,
    EvolutionSettings,
    SearchResult,
    evolutionary_search,
    random_search,
)
from supernet.search.latency import (
    LatencyTable,
    latency_key,
    load_or_build,
    mean_abs_pct_error,
    measure_model,
    validate,
)
from supernet.search.options import DIRECT_MAX_VALIDATION, SearchInputError, check_option_values
from supernet.search.pareto import pareto_front, plot_front
from supernet.search.predictor import PredictorEvaluator, fit_with_holdout
from supernet.search.timing import example_inputs, resolve_device, torch_threads

__all__ = [
    "ExportMismatch",
    "SearchInputError",
    "load_search_checkpoint",
    "SearchOptions",
    "SearchReport",
    "check_options",
    "default_table_path",
    "run_search",
    "summary",
]


class ExportMismatch(SearchInputError):
    """The exported file, loaded back, does not compute what the supernet computes (one line; a
    :class:`SearchInputError` so every command that reports those reports this the same way)."""


@dataclass
class SearchOptions:
    checkpoint: Path
    max_latency_ms: float | None = None
    max_mflops: float | None = None
    device: str = "cpu"
    task: str | None = None
    export: Path | None = None
    plot: Path | None = None
    latency_table: Path | None = None
    evaluations: int = 100
    population: int = 16
    seed: int = 0
    random_baseline: bool = False
    estimator: str = "auto"
    predictor_samples: int = 100
    val_samples: int | None = None
    bn_batches: int | None = None
    validate_latency: int = 0
    threads: int = 1
    latency_repeats: int = 50
    # a task on an operator's dataset: its packed shards (tasks.shards.local), whose validation split
    # the search evaluates on
    data: Path | None = None


@dataclass
class SearchReport:
    """Everything a run found, for printing and for ``--json``."""

    loaded: LoadedCheckpoint
    table: LatencyTable
    table_path: Path
    table_how: str
    budget_flag: str
    limit: float
    cost_unit: str
    floor: float
    estimator: str
    val_samples: int
    searches: list[SearchResult]
    chosen: Candidate
    final: dict[str, Any]
    predictor: dict[str, Any] | None = None
    exported: dict[str, Any] | None = None
    latency_validation: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def front(self) -> list[Candidate]:
        everything = [c for s in self.searches for c in s.candidates]
        return pareto_front(everything, self.loaded.workload.higher_is_better)


def default_table_path(task: str, device: str, key: str) -> Path:
    """Where tables live unless ``--latency-table`` says otherwise: the user's cache directory."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "manta" / "latency" / f"{task}-{device}-{key[:16]}.json"


def check_options(options: SearchOptions) -> tuple[str, float]:
    """The checks on the options alone (``SearchInputError``); returns the budget flag and limit. For
    callers that do slow work before :func:`run_search` (``manta-aggregator search`` joins the swarm)."""
    return check_option_values(options.max_latency_ms, options.max_mflops, options.export, options.estimator)


def load_search_checkpoint(options: SearchOptions) -> LoadedCheckpoint:
    """The checkpoint the search is of, its task's data read from ``options.data`` for a task on an
    operator's dataset; CheckpointError or SearchInputError (one line) if unusable."""
    payload = read_checkpoint(options.checkpoint)
    if options.task is not None and payload["task"] != options.task:
        raise CheckpointError(
            f"{options.checkpoint} is a checkpoint of task {payload['task']!r}, not {options.task!r} (--task)"
        )
    task = None
    if options.data is not None:
        from tasks.shards.local import open_shard_directory

        try:
            task = open_shard_directory(options.data)
        except ValueError as e:
            raise SearchInputError(f"--data: {e}") from None
        if task.name != payload["task"]:
            raise SearchInputError(
                f"--data {options.data} holds {task.name!r} data, the checkpoint is of {payload['task']!r}"
            )
    return load_checkpoint(options.checkpoint, task=task)


def _predictor_evaluator(
    options: SearchOptions, loaded: LoadedCheckpoint, direct: Evaluator, say: Callable[[str], None]
) -> tuple[Evaluator, dict[str, Any]]:
    """Evaluate random sub-networks directly, fit the predictor, report its held-out RMSE."""
    space = loaded.net.space
    rng = random.Random(derive_seed("predictor-samples", options.seed))
    configs = list(
        {c.hash: c for c in (space.sample(rng) for _ in range(options.predictor_samples))}.values()
    )
    say(f"predictor: evaluating {len(configs)} random sub-networks directly")
    values = direct.evaluate(configs)
    predictor, report = fit_with_holdout(space, configs, [values[c.hash] for c in configs], seed=options.seed)
    say(f"predictor: held-out RMSE {report['rmse']:.4g} (predicting the mean: {report['mean_rmse']:.4g})")
    return PredictorEvaluator(predictor), report


def run_search(
    options: SearchOptions,
    say: Callable[[str], None] = print,
    *,
    helpers: Sequence[Evaluator] | None = None,
    map_fn: Callable | None = None,
    checks: SpotChecks | None = None,
) -> SearchReport:
    """Run one search job (see the module docstring); raises one-line ``ValueError`` subclasses
    (``CheckpointError``, ``InfeasibleBudget``, ``DeviceError``, ``LatencyTableError``,
    ``SearchInputError``) on bad input.

    ``helpers``: evaluators (e.g. remote peers) that share the direct evaluations, through a
    :class:`~supernet.search.distributed.DistributedEvaluator` (``map_fn`` to run them in parallel,
    this process's own evaluator as the fallback for a failed share); the result is the same.
    ``checks``: spot checks of the helpers' values against that fallback (:class:`SpotChecks`; its
    counters say what they found).
    """
    started = time.perf_counter()
    device = resolve_device(options.device)
    flag, limit = check_options(options)
    loaded = load_search_checkpoint(options)
    workload, net = loaded.workload, loaded.net
    space, input_size = net.space, workload.input_size
    say(f"checkpoint {options.checkpoint}: task {workload.cfg.task}, round {loaded.round}, "
        f"{space.size():.3g} sub-networks")  # fmt: skip

    flops = FlopsCost(net, input_size)
    if flag == "--max-mflops":  # checked before the latency table is built: an error costs no time
        floor = flops(check_budget(flops, limit, flag))
    # The latency table is needed for both budgets: the chosen sub-network's predicted latency is reported.
    table, table_path, how = _latency_table(options, loaded, device, say)
    cost = flops if flag == "--max-mflops" else LatencyCost(table, space)
    if flag == "--max-latency-ms":
        floor = cost(check_budget(cost, limit, flag))

    with torch_threads(options.threads):
        direct = DirectEvaluator(
            workload, net, val_samples=options.val_samples, bn_batches=options.bn_batches, seed=options.seed
        )
        estimator = options.estimator
        if estimator == "auto":
            estimator = "direct" if len(workload.task.val_set) <= DIRECT_MAX_VALIDATION else "predictor"
        evaluator: Evaluator = direct
        if helpers:
            evaluator = DistributedEvaluator(helpers, map_fn=map_fn, fallback=direct, checks=checks)
        predictor_report = None
        if estimator == "predictor":
            evaluator, predictor_report = _predictor_evaluator(options, loaded, evaluator, say)
        searches = _searches(options, loaded, cost, limit, evaluator, say)
        hib = workload.higher_is_better
        chosen = min(
            (s.best for s in searches), key=lambda c: (-c.metric if hib else c.metric, c.cost, c.hash)
        )
        say("evaluating the chosen sub-network on the full validation set and exporting it")
        final, model = _final(options, loaded, table, chosen, device)
        report = SearchReport(
            loaded, table, table_path, how, flag, limit, cost.unit, floor, estimator, direct.val_samples,
            searches, chosen, final, predictor_report,
        )  # fmt: skip
        if options.export is not None:
            report.exported = _export(options, report, model)
        if options.validate_latency:
            rng = random.Random(derive_seed("latency-validation", options.seed))
            configs = [space.sample(rng) for _ in range(options.validate_latency)]
            say(f"validating the latency table on {len(configs)} random exported sub-networks")
            report.latency_validation = validate(
                table, net, workload.family, input_size, device, configs, threads=options.threads,
                repeats=options.latency_repeats,
            )  # fmt: skip
    if options.plot is not None:
        _plot(options.plot, report)
    report.seconds = time.perf_counter() - started
    return report


def _latency_table(
    options: SearchOptions, loaded: LoadedCheckpoint, device: torch.device, say: Callable[[str], None]
) -> tuple[LatencyTable, Path, str]:
    workload, net = loaded.workload, loaded.net
    key = latency_key(net, workload.family, workload.input_size, device, options.threads)
    path = Path(options.latency_table or default_table_path(workload.cfg.task, device.type, key))
    table, how = load_or_build(
        path, net, workload.family, workload.input_size, device, threads=options.threads,
        repeats=options.latency_repeats, progress=say, meta={"task": workload.cfg.task},
    )  # fmt: skip
    say(f"latency table {path}: {how} ({device.type}, {options.threads} torch thread(s), batch 1)")
    return table, path, how


def _searches(
    options: SearchOptions,
    loaded: LoadedCheckpoint,
    cost: CostModel,
    limit: float,
    evaluator: Evaluator,
    say: Callable[[str], None],
) -> list[SearchResult]:
    """Evolution, and the random baseline with as many evaluations if asked for."""
    space, hib = loaded.net.space, loaded.workload.higher_is_better
    settings = EvolutionSettings(
        evaluations=options.evaluations, population=options.population, seed=options.seed
    )
    searches = [
        evolutionary_search(space, cost, limit, evaluator, settings, higher_is_better=hib, progress=say)
    ]
    if options.random_baseline:
        baseline = random_search(
            space, cost, limit, evaluator, options.evaluations, batch=options.population, seed=options.seed,
            higher_is_better=hib, progress=say,
        )  # fmt: skip
        searches.append(baseline)
    return searches


def _final(
    options: SearchOptions,
    loaded: LoadedCheckpoint,
    table: LatencyTable,
    chosen: Candidate,
    device: torch.device,
) -> tuple[dict[str, Any], torch.nn.Module]:
    """The chosen sub-network on the full validation set, exported, its latency measured end to end."""
    workload, net = loaded.workload, loaded.net
    row, model = recalibrated_export(workload, net, chosen.config)
    inputs = example_inputs(workload.family, tuple(workload.input_size), device)
    measured = measure_model(model, inputs, device, repeats=options.latency_repeats)
    final = {
        "metric": float(row[workload.metric_name]),
        "search_metric": chosen.metric,
        "mflops": net.flops(chosen.config, workload.input_size) / 1e6,
        "params": int(row["params"]),
        "predicted_ms": table.predict(chosen.config),
        "measured_ms": measured,
    }
    return final, model.cpu()


def _plot(path: Path, report: SearchReport) -> None:

    workload = report.loaded.workload
    task, metric = workload.cfg.task, workload.metric_name
    plot_front(
        path, [(s.method, s.candidates) for s in report.searches], higher_is_better=workload.higher_is_better,
        metric_label=metric, cost_label=report.cost_unit, limit=report.limit, chosen=report.chosen,
        percent=metric == "accuracy", title=f"{task}: {metric} vs {report.cost_unit} (under the budget)",
    )  # fmt: skip


def _export(options: SearchOptions, report: SearchReport, model: torch.nn.Module) -> dict[str, Any]:
    workload, loaded, chosen = report.loaded.workload, report.loaded, report.chosen
    info = {
        "task": workload.cfg.task,
        "task_options": dict(workload.task.options),
        "family": workload.family,
        "config": chosen.config.to_dict(),
        "config_str": str(chosen.config),
        "hash": chosen.hash,
        "metric": {
            "name": workload.metric_name,
            "value": report.final["metric"],
            "higher_is_better": workload.higher_is_better,
            "validation_samples": len(workload.task.val_set),
        },
        "mflops": report.final["mflops"],
        "params": report.final["params"],
        "latency_ms": {
            "device": report.table.device,
            "device_name": report.table.meta.get("device_name"),
            "predicted": report.final["predicted_ms"],
            "measured": report.final["measured_ms"],
            "threads": options.threads,
            "batch": 1,
        },
        "input": input_description(workload),
        "checkpoint": {"path": str(options.checkpoint), "round": loaded.round, "digest": loaded.digest},
    }
    fmt = format_of(options.export)
    batch = check_batch(workload)
    path, json_path = save_subnet(model, options.export, info, batch, input_names(workload))
    reloaded = load_model(path, fmt)
    inputs = example_inputs(workload.family, tuple(workload.input_size), torch.device("cpu"))
    with torch.no_grad():
        difference = float((reloaded(*inputs) - model(*inputs)).abs().max())
    from_supernet, bound = supernet_difference(loaded.net, chosen.config, reloaded, batch)
    if not from_supernet <= bound:
        raise ExportMismatch(
            f"--export {path}: the {fmt} file's output differs from the supernet's by {from_supernet:.3g} "
            f"on {len(batch[0])} validation samples (tolerance {bound:.3g}); do not use it"
        )
    return {
        "path": str(path),
        "json": str(json_path),
        "format": fmt,
        "reloaded_metric": evaluate_model(workload, reloaded),
        "max_abs_difference": difference,
        "supernet_max_abs_difference": from_supernet,
        "tolerance": bound,
        "check_samples": min(CHECK_SAMPLES, len(workload.task.val_set)),
    }


def summary(report: SearchReport) -> dict[str, Any]:
    """The report as plain JSON values (``--json``)."""
    workload = report.loaded.workload

    def candidate(c: Candidate) -> dict[str, Any]:
        return {"hash": c.hash, "config": c.config.to_dict(), "metric": c.metric, "cost": c.cost,
                "method": c.method, "generation": c.generation}  # fmt: skip

    out: dict[str, Any] = {
        "task": workload.cfg.task,
        "metric": workload.metric_name,
        "budget": {
            "flag": report.budget_flag,
            "limit": report.limit,
            "unit": report.cost_unit,
            "smallest": report.floor,
        },  # fmt: skip
        "estimator": report.estimator,
        "val_samples": report.val_samples,
        "latency_table": {
            "path": str(report.table_path),
            "how": report.table_how,
            "device": report.table.device,
            "fixed_ms": report.table.fixed_ms,
            "scale": report.table.scale,
        },  # fmt: skip
        "searches": [
            {
                "method": s.method,
                "evaluations": s.evaluations,
                "generations": s.generations,
                "best": candidate(s.best),
                "stopped_early": s.stopped_early,
            }  # fmt: skip
            for s in report.searches
        ],
        "front": [candidate(c) for c in report.front],
        "chosen": {**candidate(report.chosen), **report.final},
        "predictor": report.predictor,
        "exported": report.exported,
        "seconds": report.seconds,
    }
    if report.latency_validation:
        out["latency_validation"] = {"rows": report.latency_validation,
                                     "mae_pct": mean_abs_pct_error(report.latency_validation)}  # fmt: skip
    return out
