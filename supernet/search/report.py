"""What ``manta-search`` and ``manta-aggregator search`` do with their options and results: the
search options, progress lines, one-line errors, the human-readable result and the JSON report.
Imports torch (through the search itself); the command lines import this module only once their
input is checked."""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from console.commands import UserError
from supernet.checkpoint import CheckpointError
from supernet.search.cost import InfeasibleBudget
from supernet.search.latency import LatencyTableError, mean_abs_pct_error
from supernet.search.pareto import format_front
from supernet.search.run import (
    SearchInputError,
    SearchOptions,
    SearchReport,
    run_search,
)
from supernet.search.timing import DeviceError

__all__ = ["options_from", "progress", "render", "search_or_fail", "write_json"]


def options_from(checkpoint: Path, given: dict[str, Any]) -> SearchOptions:
    """The :class:`SearchOptions` of :func:`supernet.search.options.search_options`' keyword arguments
    (``json_path`` is not a search option and is ignored)."""
    names = {f.name for f in dataclasses.fields(SearchOptions)} - {"checkpoint", "export"}
    return SearchOptions(
        checkpoint, export=given["export_path"], **{k: v for k, v in given.items() if k in names}
    )


def progress() -> Callable[[str], None]:
    """Where progress lines go: stderr, while logging shows INFO (``-q`` or MANTA_LOG_LEVEL=WARNING
    hide them)."""
    shown = logging.getLogger().isEnabledFor(logging.INFO)

    def say(line: str) -> None:
        if shown:
            click.echo(line, err=True)

    return say


def search_or_fail(options: SearchOptions, say: Callable[[str], None], **kwargs: Any) -> SearchReport:
    """:func:`run_search`, with bad input turned into a one-line :class:`UserError`."""
    try:
        return run_search(options, say, **kwargs)
    except (CheckpointError, InfeasibleBudget, DeviceError, LatencyTableError, SearchInputError) as e:
        raise UserError(str(e)) from None
    except OSError as e:
        raise UserError(f"{e.filename or ''}: {e.strerror or e}".lstrip(": ")) from None


def write_json(path: Path | None, data: dict[str, Any]) -> None:
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def _metric(value: float, percent: bool) -> str:
    return f"{100 * value:.2f} %" if percent else f"{value:.4f}"


def render(report: SearchReport) -> str:
    """The human-readable result (stdout)."""
    workload = report.loaded.workload
    name = workload.metric_name
    percent = name == "accuracy"
    table, final, chosen = report.table, report.final, report.chosen
    threads = table.meta.get("threads", 1)
    lines = [
        f"budget: {report.budget_flag} {report.limit:g} (smallest sub-network {report.floor:.4g} {report.cost_unit})",
        f"latency model: {table.device} ({table.meta.get('device_name', '?')}), {threads} torch thread(s), "
        f"batch 1: {len(table.entries)} block entries, predicted = {table.fixed_ms:.3f} ms + "
        f"{table.scale:.3f} × blocks [{report.table_how}: {report.table_path}]",
        f"accuracy estimate: {report.estimator}, {report.val_samples} validation samples per evaluation "
        "after BN recalibration"
        + (
            ""
            if report.predictor is None
            else f"; predictor held-out RMSE {report.predictor['rmse']:.4g} "
            f"(mean predictor {report.predictor['mean_rmse']:.4g}, "
            f"{report.predictor['n_test']} held out)"
        ),  # fmt: skip
    ]
    for s in report.searches:
        note = f" — stopped early: {s.stopped_early}" if s.stopped_early else ""
        lines.append(
            f"{s.method} search: {s.evaluations} evaluations, {s.generations} generation(s), best "
            f"{name} {_metric(s.best.metric, percent)} at {s.best.cost:.4g} {report.cost_unit}{note}"
        )
    lines += ["", f"Pareto front ({name} vs {report.cost_unit}, evaluated sub-networks under the budget):"]
    flops = {c.hash: report.loaded.net.flops(c.config, workload.input_size) / 1e6 for c in report.front}
    columns = [
        ("MFLOPs", lambda c: f"{flops[c.hash]:.3f}"),
        ("pred. ms", lambda c: f"{table.predict(c.config):.3f}"),
    ]
    lines.append(format_front(report.front, name, columns, percent=percent))
    lines += [
        "",
        f"chosen: {chosen.config}",
        f"  hash       {chosen.hash}",
        f"  {name:<10} {_metric(final['metric'], percent)} on the full validation set "
        f"({len(workload.task.val_set)} samples; {_metric(final['search_metric'], percent)} in the search)",
        f"  FLOPs      {final['mflops']:.3f} M multiply-adds per sample, {final['params']:,} parameters",
        f"  latency    predicted {final['predicted_ms']:.3f} ms, measured {final['measured_ms']:.3f} ms "
        f"({table.device}, batch 1, {threads} torch thread(s))",
    ]
    if report.exported:
        e = report.exported
        lines.append(
            f"exported: {e['path']} ({e['format']}) and {e['json']}; reloaded {name} "
            f"{_metric(e['reloaded_metric'], percent)}, max |Δ output| {e['max_abs_difference']:.2g}, "
            f"from the supernet {e['supernet_max_abs_difference']:.2g} (tolerance {e['tolerance']:.2g})"
        )
    if report.latency_validation:
        lines.append(
            f"latency table check: mean absolute error {mean_abs_pct_error(report.latency_validation):.1f} % "
            f"over {len(report.latency_validation)} random exported sub-networks"
        )
    lines.append(f"done in {report.seconds:.0f} s")
    return "\n".join(lines)
