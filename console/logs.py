"""One logging set-up for every MANTA process.

All entry points (`manta-peer`, `manta-aggregator`, `manta-ledger`, `manta-swarm`) and every worker
process they start call :func:`setup_logging` once, so a single variable, ``MANTA_LOG_LEVEL``, governs
what every process of a run prints. hivemind keeps its own handler on the ``hivemind`` logger; we
leave it alone but silence it unless MANTA logs at DEBUG, because its lines are meant for hivemind
developers, not for volunteers.
"""

from __future__ import annotations

import logging
import os
import sys

LOG_LEVEL_ENV = "MANTA_LOG_LEVEL"
_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"
_DATEFMT = "%H:%M:%S"


def resolve_level(value: str | None) -> int:
    """Map a level name or number from the environment to a logging level; unknown values mean INFO."""
    if not value:
        return logging.INFO
    value = value.strip()
    if value.isdigit():
        return int(value)
    level = logging.getLevelName(value.upper())
    return level if isinstance(level, int) else logging.INFO


def setup_logging(level: str | int | None = None) -> int:
    """Configure the root logger for this process and return the level in force.

    Idempotent: calling it again (e.g. in a forked worker) replaces MANTA's handler rather than
    stacking a second one, so lines are never printed twice.
    """
    if level is None:
        level = resolve_level(os.environ.get(LOG_LEVEL_ENV))
    elif isinstance(level, str):
        level = resolve_level(level)
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, "_manta", False):
            root.removeHandler(handler)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(_FORMAT, _DATEFMT))
    handler._manta = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(level)
    # hivemind reads HIVEMIND_LOGLEVEL at import. It logs expected events of a swarm (a group that did
    # not form, a peer that left) as errors with tracebacks; MANTA reports those itself, one line each,
    # so hivemind speaks only at DEBUG (or when HIVEMIND_LOGLEVEL is set explicitly).
    os.environ.setdefault("HIVEMIND_LOGLEVEL", "DEBUG" if level <= logging.DEBUG else "CRITICAL")
    return level
