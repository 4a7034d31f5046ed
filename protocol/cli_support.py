"""What every MANTA console script shares: version flag, logging, and one-line errors.

A volunteer who mistypes a path must see one clear line and a non-zero exit, not a traceback. Code
anywhere below a CLI raises :class:`UserError` (or a ``ValueError``/``OSError`` that the command turns
into one); click prints ``Error: <message>`` and exits with status 1 (2 for usage errors).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from protocol import __version__
from protocol.logs import setup_logging


class UserError(click.ClickException):
    """A problem with the user's input or environment, reported as one line."""


def manta_group(prog_name: str, help_text: str) -> Callable[[Callable[..., Any]], click.Group]:
    """Decorator for a console script's top-level click group (adds ``--version`` and logging)."""

    def decorate(fn: Callable[..., Any]) -> click.Group:
        @click.group(help=help_text, context_settings={"help_option_names": ["-h", "--help"]})
        @click.version_option(__version__, "--version", prog_name=prog_name)
        def group() -> None:
            setup_logging()
            fn()

        group.__name__ = fn.__name__
        return group

    return decorate
