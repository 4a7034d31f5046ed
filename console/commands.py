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

from console.logs import LOG_FORMATS, apply_log_options
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


def _log_option_seen(ctx: click.Context, param: click.Parameter, value: Any) -> None:
    """Record a logging option given on the command line (ctx.meta is shared by a group and its
    sub-command, so ``manta-peer -q join --log-format json`` combines both) and apply them all."""
    given = ctx.meta.setdefault("manta.log", {"verbose": 0, "quiet": 0, "fmt": None})
    if param.name == "log_format":
        if value is not None:
            given["fmt"] = value
    elif value:
        given[param.name] += value
    apply_log_options(**given)


def log_params() -> list[click.Option]:
    """``-v/--verbose``, ``-q/--quiet`` and ``--log-format``: they set up logging as they are parsed
    and are not passed to the command's function."""
    return [
        click.Option(["-v", "--verbose"], count=True, expose_value=False, callback=_log_option_seen,
                     help="Log debugging detail too (as MANTA_LOG_LEVEL=DEBUG)."),
        click.Option(["-q", "--quiet"], count=True, expose_value=False, callback=_log_option_seen,
                     help="Log warnings and errors only; -qq: errors only."),
        click.Option(["--log-format"], type=click.Choice(LOG_FORMATS), default=None, expose_value=False,
                     callback=_log_option_seen,
                     help="text (default) or json: one JSON object per line (as MANTA_LOG_FORMAT)."),
    ]  # fmt: skip


def log_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator form of :func:`log_params`, for a function that is about to become a command."""
    # click shows the decorators' list reversed: these go first in it, to be shown after the others.
    fn.__click_params__ = [*reversed(log_params()), *getattr(fn, "__click_params__", [])]  # type: ignore[attr-defined]
    return fn


class OneLineErrorsGroup(_OneLineUsage, click.Group):
    """A console script's top-level group whose usage errors are one line; every sub-command added to
    it takes the logging options too (``manta-peer join -v`` as well as ``manta-peer -v join``)."""

    def add_command(self, cmd: click.Command, name: str | None = None) -> None:
        if not any(p.name == "verbose" for p in cmd.params):
            cmd.params.extend(log_params())
        super().add_command(cmd, name)


class OneLineErrorsCommand(_OneLineUsage, click.Command):
    """A single-command console script whose usage errors are one line."""


def manta_group(prog_name: str, help_text: str) -> Callable[[Callable[..., Any]], click.Group]:
    """Decorator for a console script's top-level click group (adds ``--version`` and the logging
    options, to the group and to each of its sub-commands)."""

    def decorate(fn: Callable[..., Any]) -> click.Group:
        @click.group(
            cls=OneLineErrorsGroup, help=help_text, context_settings={"help_option_names": ["-h", "--help"]}
        )
        @click.version_option(__version__, "--version", prog_name=prog_name)
        @log_options
        def group() -> None:
            fn()

        group.__name__ = fn.__name__
        return group

    return decorate


def manta_command(prog_name: str, help_text: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Like :func:`manta_group`, for a console script that is a single command: use it as the outermost
    decorator, above the function's ``click.option`` decorators."""

    def decorate(fn: Callable[..., Any]) -> click.Command:
        def run(*args: Any, **kwargs: Any) -> Any:
            return fn(*args, **kwargs)

        run.__name__, run.__doc__ = fn.__name__, fn.__doc__
        run.__click_params__ = getattr(fn, "__click_params__", [])  # the options declared on fn
        command = click.command(
            cls=OneLineErrorsCommand, help=help_text, context_settings={"help_option_names": ["-h", "--help"]}
        )(log_options(run))
        return click.version_option(__version__, "--version", prog_name=prog_name)(command)

    return decorate
