"""``manta-search``: the most accurate sub-network of a trained supernet under a latency or FLOPs budget.

    manta-search --checkpoint PATH (--max-latency-ms X | --max-mflops Y) [--device cpu|cuda]
                 [--export out.pt] [--plot pareto.png] [--task NAME] [--random-baseline] ...

Progress goes to stderr, results to stdout. Bad input (a checkpoint of another task or format
version, an unknown device, a budget below the smallest sub-network, ...) ends with one line
``Error: ...`` and exit status 1.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from console.commands import OneLineErrorsCommand, UserError
from console.logs import setup_logging
from protocol import __version__
from supernet.checkpoint import CheckpointError
from supernet.search.cost import InfeasibleBudget
from supernet.search.latency import LatencyTableError, mean_abs_pct_error
from supernet.search.options import PATH, search_options
from supernet.search.pareto import format_front
from supernet.search.run import (
    SearchInputError,
    SearchOptions,
    SearchReport,
    run_search,
    summary,
)
from supernet.search.timing import DeviceError

__all__ = ["main", "options_from", "progress", "render", "search_options", "search_or_fail", "write_json"]


def options_from(checkpoint: Path, given: dict[str, Any]) -> SearchOptions:
    """The :class:`SearchOptions` of :func:`search_options`' keyword arguments (``json_path`` and
    ``quiet`` are not search options and are ignored)."""
    names = {f.name for f in dataclasses.fields(SearchOptions)} - {"checkpoint", "export"}
    return SearchOptions(
        checkpoint, export=given["export_path"], **{k: v for k, v in given.items() if k in names}
    )


def progress(quiet: bool) -> Callable[[str], None]:
    """Where progress lines go: stderr, unless ``--quiet``."""

    def say(line: str) -> None:
        if not quiet:
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


@click.command(
    cls=OneLineErrorsCommand,
    help="Find the most accurate sub-network of a supernet checkpoint under a latency or FLOPs budget, "
    "and export it as a standalone TorchScript, torch.export or ONNX model.",
    context_settings={"help_option_names": ["-h", "--help"]},
)
@click.version_option(__version__, "--version", prog_name="manta-search")
@click.option("--checkpoint", required=True, type=PATH, help="A MANTA supernet checkpoint (.pt).")
@search_options
def main(checkpoint: Path, json_path: Path | None, quiet: bool, **search: Any) -> None:
    setup_logging()
    report = search_or_fail(options_from(checkpoint, search), progress(quiet))
    click.echo(render(report))
    write_json(json_path, summary(report))


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
