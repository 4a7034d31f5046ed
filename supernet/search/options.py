"""The search's command-line options, shared by ``manta-search`` and ``manta-aggregator search``.

Only click is imported here: ``manta-aggregator`` builds its ``search`` sub-command from these, and a
command line that merely offers a search (``manta-aggregator --help``, ``start``) must not pay for
loading torch.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

__all__ = ["DIRECT_MAX_VALIDATION", "PATH", "search_options"]

DIRECT_MAX_VALIDATION = 2000
"""``--accuracy auto`` evaluates directly when the task has at most this many validation samples."""

PATH = click.Path(path_type=Path, dir_okay=False)


def search_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Every option of a search job except ``--checkpoint`` (shared with ``manta-aggregator search``);
    the command receives them as keyword arguments for :func:`options_from`, plus ``json_path`` and
    ``quiet``."""
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
        click.option("--quiet", is_flag=True, help="No progress lines on stderr."),
    ]  # fmt: skip
    for option in reversed(options):
        fn = option(fn)
    return fn
