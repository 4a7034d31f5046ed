"""``manta-search``: the most accurate sub-network of a trained supernet under a latency or FLOPs budget.

    manta-search --checkpoint PATH (--max-latency-ms X | --max-mflops Y) [--device cpu|cuda]
                 [--export out.pt] [--plot pareto.png] [--task NAME] [--random-baseline] ...

Progress goes to stderr, results to stdout. Bad input (a checkpoint of another task or format
version, an unknown device, a budget below the smallest sub-network, ...) ends with one line
``Error: ...`` and exit status 1. This module imports only click: ``--help`` and a usage error answer
before torch is loaded (:mod:`supernet.search.report` does the rest).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from console.commands import UserError, manta_command
from supernet.search.options import PATH, SearchInputError, check_option_values, search_options

__all__ = ["main"]


@manta_command(
    "manta-search",
    "Find the most accurate sub-network of a supernet checkpoint under a latency or FLOPs budget, "
    "and export it as a standalone TorchScript, torch.export or ONNX model.",
)
@click.option("--checkpoint", required=True, type=PATH, help="A MANTA supernet checkpoint (.pt).")
@search_options
def main(checkpoint: Path, json_path: Path | None, **search: Any) -> None:
    try:  # the checks that need no torch, before loading it
        check_option_values(
            search["max_latency_ms"], search["max_mflops"], search["export_path"], search["estimator"]
        )
        if not checkpoint.is_file():
            raise SearchInputError(f"checkpoint {checkpoint} does not exist")
    except SearchInputError as e:
        raise UserError(str(e)) from None
    from supernet.search.report import options_from, progress, render, search_or_fail, write_json
    from supernet.search.run import summary

    report = search_or_fail(options_from(checkpoint, search), progress())
    click.echo(render(report))
    write_json(json_path, summary(report))
