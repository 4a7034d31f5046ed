"""What every MANTA console script shares: version flag, logging, and one-line errors.

A volunteer who mistypes a path must see one clear line and a non-zero exit, not a traceback. Code
anywhere below a CLI raises :class:`UserError` (or a ``ValueError``/``OSError`` that the command turns
into one); click prints ``Error: <message>`` and exits with status 1 (2 for usage errors). Usage
errors (an unknown option, a missing argument) are one line too: click's own form is four (usage,
hint, blank, error), which pushes the one line that matters below three that do not.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from console.logs import setup_logging
from protocol import __version__


class UserError(click.ClickException):
    """A problem with the user's input or environment, reported as one line."""


class OneLineUsageError(click.UsageError):
    """A usage error shown as ``Error: <message> (see '<command> --help')`` on one line."""

    def show(self, file: Any = None) -> None:
        hint = f" (see '{self.ctx.command_path} --help')" if self.ctx is not None else ""
        click.echo(f"Error: {self.format_message()}{hint}", file=file, err=True)


class _OneLineUsage:
    """Mixin for a top-level command: usage errors raised while parsing or dispatching (including in
    sub-commands, which the group invokes) become :class:`OneLineUsageError`."""

    def make_context(self, *args: Any, **kwargs: Any) -> click.Context:
        try:
            return super().make_context(*args, **kwargs)  # type: ignore[misc]
        except OneLineUsageError:
            raise
        except click.UsageError as e:
            raise _one_line(e) from None

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)  # type: ignore[misc]
        except OneLineUsageError:
            raise
        except click.UsageError as e:
            raise _one_line(e) from None


def _one_line(error: click.UsageError) -> OneLineUsageError:
    converted = OneLineUsageError(error.format_message(), error.ctx)
    converted.exit_code = error.exit_code
    return converted


class OneLineErrorsGroup(_OneLineUsage, click.Group):
    """A console script's top-level group whose usage errors are one line."""


class OneLineErrorsCommand(_OneLineUsage, click.Command):
    """A single-command console script whose usage errors are one line."""


def manta_group(prog_name: str, help_text: str) -> Callable[[Callable[..., Any]], click.Group]:
    """Decorator for a console script's top-level click group (adds ``--version`` and logging)."""

    def decorate(fn: Callable[..., Any]) -> click.Group:
        @click.group(
            cls=OneLineErrorsGroup, help=help_text, context_settings={"help_option_names": ["-h", "--help"]}
        )
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
        command = click.command(
            cls=OneLineErrorsCommand, help=help_text, context_settings={"help_option_names": ["-h", "--help"]}
        )(run)
        return click.version_option(__version__, "--version", prog_name=prog_name)(command)

    return decorate
