"""One logging set-up for every MANTA process.

All entry points (`manta-peer`, `manta-aggregator`, `manta-ledger`, `manta-swarm`, `manta-search`)
and every worker process they start call :func:`setup_logging`, so two variables govern what every
process of a run prints: ``MANTA_LOG_LEVEL`` (a level name or number) and ``MANTA_LOG_FORMAT``
(``text`` or ``json``). The command-line options ``-v``, ``-q`` and ``--log-format`` win over them:
:func:`apply_log_options` writes the chosen values into this process's environment, which every child
process (forked or spawned worker, or a `manta-swarm` peer) inherits.

Text lines: ``2026-11-27T14:03:05 INFO    manta.peer: message`` (local time, ISO-8601). JSON lines: one
object per record, ``{"time", "level", "logger", "message"}`` and ``"exception"`` when there is one;
``time`` is ISO-8601 with milliseconds and the UTC offset.

hivemind keeps its own handler on the ``hivemind`` logger; we leave it alone but silence it unless
MANTA logs at DEBUG, because its lines are meant for hivemind developers, not for volunteers.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import sys

LOG_LEVEL_ENV = "MANTA_LOG_LEVEL"
LOG_FORMAT_ENV = "MANTA_LOG_FORMAT"
LOG_FORMATS = ("text", "json")
_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"
_DATEFMT = "%Y-%m-%dT%H:%M:%S"
# Whether HIVEMIND_LOGLEVEL was set before MANTA set it: only then is it the user's choice to keep.
_HIVEMIND_PRESET = "HIVEMIND_LOGLEVEL" in os.environ


def resolve_level(value: str | None) -> int:
    """Map a level name or number from the environment to a logging level; unknown values mean INFO."""
    if not value:
        return logging.INFO
    value = value.strip()
    if value.isdigit():
        return int(value)
    level = logging.getLevelName(value.upper())
    return level if isinstance(level, int) else logging.INFO


def resolve_format(value: str | None) -> str:
    """``text`` or ``json`` from the environment; anything else means ``text``."""
    value = (value or "").strip().lower()
    return value if value in LOG_FORMATS else "text"


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time (ISO-8601, ms, UTC offset), level, logger, message, and
    exception (the formatted traceback) when the record carries one."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = datetime.datetime.fromtimestamp(record.created).astimezone()
        line = {
            "time": stamp.isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exception"] = record.exc_text
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return json.dumps(line, ensure_ascii=False)


def setup_logging(level: str | int | None = None, fmt: str | None = None) -> int:
    """Configure the root logger for this process and return the level in force.

    ``level`` and ``fmt`` default to ``MANTA_LOG_LEVEL`` and ``MANTA_LOG_FORMAT``. Idempotent: calling
    it again (e.g. in a forked worker) replaces MANTA's handler rather than stacking a second one, so
    lines are never printed twice.
    """
    if level is None:
        level = resolve_level(os.environ.get(LOG_LEVEL_ENV))
    elif isinstance(level, str):
        level = resolve_level(level)
    fmt = resolve_format(os.environ.get(LOG_FORMAT_ENV) if fmt is None else fmt)
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, "_manta", False):
            root.removeHandler(handler)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(_FORMAT, _DATEFMT))
    handler._manta = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(level)
    # hivemind reads HIVEMIND_LOGLEVEL at import. It logs expected events of a swarm (a group that did
    # not form, a peer that left) as errors with tracebacks; MANTA reports those itself, one line each,
    # so hivemind speaks only at DEBUG (or when HIVEMIND_LOGLEVEL is set explicitly).
    if not _HIVEMIND_PRESET:
        os.environ["HIVEMIND_LOGLEVEL"] = "DEBUG" if level <= logging.DEBUG else "CRITICAL"
    return level


def apply_log_options(verbose: int = 0, quiet: int = 0, fmt: str | None = None) -> int:
    """Set up logging from the command line's ``-v``/``-q`` counts and ``--log-format``, which win over
    the environment, and put the result into ``os.environ`` for the child processes; returns the level.

    ``-v`` (any count) is DEBUG; ``-q`` is WARNING, ``-qq`` ERROR, ``-qqq`` CRITICAL; both given, they
    offset each other from INFO. Neither given: ``MANTA_LOG_LEVEL`` (default INFO) stays in force.
    """
    if verbose or quiet:
        level = logging.INFO + 10 * (quiet - min(verbose, 1))
        level = min(max(level, logging.DEBUG), logging.CRITICAL)
        os.environ[LOG_LEVEL_ENV] = logging.getLevelName(level)
    if fmt is not None:
        os.environ[LOG_FORMAT_ENV] = resolve_format(fmt)
    return setup_logging()
