"""The search's command-line options, shared by ``manta-search`` and ``manta-aggregator search``.

Only click is imported here: ``manta-aggregator`` builds its ``search`` sub-command from these, and a
command line that merely offers a search (``manta-aggregator --help``, ``start``) must not pay for
loading torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from supernet.export_choice import format_of, missing_packages

__all__ = [
    "DIRECT_MAX_VALIDATION",
    "ESTIMATORS",
    "PATH",
    "SearchInputError",
    "check_option_values",
    "search_options",
]

DIRECT_MAX_VALIDATION = 2000
"""``--accuracy auto`` evaluates directly when the task has at most this many validation samples."""

PATH = click.Path(path_type=Path, dir_okay=False)
ESTIMATORS = ("auto", "direct", "predictor")


class SearchInputError(ValueError):
    """A bad option or option combination (one line saying which)."""


def check_option_values(
    max_latency_ms: float | None, max_mflops: float | None, export: Path | None, estimator: str
) -> tuple[str, float]:
    """The checks on the options alone (``SearchInputError``): exactly one positive budget, a model
    file to export to, a known estimator. Returns the budget's flag and limit. No torch: a command
    runs them before loading it."""
    given = [(f, v) for f, v in (("--max-latency-ms", max_latency_ms),
                                 ("--max-mflops", max_mflops)) if v is not None]  # fmt: skip
    if len(given) != 1:
        raise SearchInputError("give exactly one budget: --max-latency-ms X or --max-mflops Y")
    flag, limit = given[0]
    if not math.isfinite(limit) or limit <= 0:
        raise SearchInputError(f"{flag}: the budget must be a positive number, got {limit:g}")
    if export is not None and export.suffix == ".json":
        raise SearchInputError(f"--export {export}: give the model file (e.g. model.pt); "
                               "its config JSON is written beside it")  # fmt: skip
    if export is not None and (missing := missing_packages(format_of(export))):
        raise SearchInputError(f"--export {export}: {format_of(export)} export needs "
                               f"{', '.join(missing)}: pip install {' '.join(missing)}")  # fmt: skip
    if estimator not in ESTIMATORS:
        raise SearchInputError(f"--accuracy: unknown {estimator!r} (choose {', '.join(ESTIMATORS)})")
    return flag, limit


def search_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Every option of a search job except ``--checkpoint`` (shared with ``manta-aggregator search``);
    the command receives them as keyword arguments for :func:`supernet.search.report.options_from`,
    plus ``json_path``. Progress lines follow the logging options (``-q`` hides them)."""
    options = [
        click.option("--max-latency-ms", type=float, default=None, help="Budget: predicted latency (ms, batch 1)."),
        click.option("--max-mflops", type=float, default=None, help="Budget: millions of multiply-adds per sample."),
        click.option("--device", default="cpu", show_default=True, help="Latency device: cpu or cuda."),
        click.option("--task", default=None, help="Refuse a checkpoint of any other task."),
        click.option("--data", type=click.Path(path_type=Path, file_okay=False), default=None,
                     help="A task on your own data: the directory manta-aggregator packed it into (its --data-dir)."),
        click.option("--export", "export_path", type=PATH, default=None,
                     help="Write the chosen sub-network here, its config JSON beside it; the suffix picks the "
                     "format: .pt2 torch.export, .onnx ONNX, else TorchScript (.pt)."),
        click.option("--plot", type=PATH, default=None, help="Write the Pareto-front plot here (PNG)."),
        click.option("--json", "json_path", type=PATH, default=None, help="Write the full report here (JSON)."),
        click.option("--latency-table", type=PATH, default=None,
                     help="Latency table file (reused if it matches; default: in ~/.cache/manta/latency)."),
        click.option("--evaluations", type=click.IntRange(1), default=100, show_default=True,
                     help="Sub-networks the search evaluates."),
        click.option("--population", type=click.IntRange(2), default=16, show_default=True),
        click.option("--seed", type=int, default=0, show_default=True),
        click.option("--random-baseline", is_flag=True, help="Also run random search with as many evaluations."),
        click.option("--accuracy", "estimator", default="auto", show_default=True,
                     help=f"direct, predictor, or auto (direct if the task has <= {DIRECT_MAX_VALIDATION} "
                     "validation samples)."),
        click.option("--predictor-samples", type=click.IntRange(10), default=100, show_default=True,
                     help="Directly evaluated random sub-networks that train the predictor."),
        click.option("--val-samples", type=click.IntRange(1), default=None,
                     help="Validation samples per direct evaluation during the search (default: all)."),
        click.option("--bn-batches", type=click.IntRange(1), default=None,
                     help="BN recalibration batches per evaluation (default: the checkpoint's)."),
        click.option("--validate-latency", type=click.IntRange(0), default=0, show_default=True,
                     help="Check the latency table against this many random exported sub-networks."),
        click.option("--threads", type=click.IntRange(1), default=1, show_default=True,
                     help="Torch threads (latency is measured with this many; 1 on a shared machine)."),
        click.option("--latency-repeats", type=click.IntRange(1), default=50, show_default=True,
                     help="Timed calls per latency-table entry and per end-to-end measurement (median)."),
    ]  # fmt: skip
    for option in reversed(options):
        fn = option(fn)
    return fn
