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


def manta_command(prog_name: str, help_text: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Like :func:`manta_group`, for a console script that is a single command: use it as the outermost
    decorator, above the function's ``click.option`` decorators."""

    def decorate(fn: Callable[..., Any]) -> click.Command:
        def run(*args: Any, **kwargs: Any) -> Any:
            setup_logging()
            return fn(*args, **kwargs)

        run.__name__, run.__doc__ = fn.__name__, fn.__doc__
        run.__click_params__ = getattr(fn, "__click_params__", [])  # the options declared on fn
        command = click.command(help=help_text, context_settings={"help_option_names": ["-h", "--help"]})(run)
        return click.version_option(__version__, "--version", prog_name=prog_name)(command)

    return decorate
