"""Ctrl-C for the developer tools that build an emulated internet: a stop signal becomes an exception
the tool can clean up after, and the cleanup itself (stopping processes, deleting namespaces) cannot
be cut short by a second one, so nothing it started outlives it.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


@contextmanager
def _stop_signals_handled_by(handler: Callable) -> Iterator[None]:
    """``handler`` for both stop signals inside; the previous handlers back on the way out."""
    previous = {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


@contextmanager
def stop_signals_interrupt() -> Iterator[None]:
    """Inside, SIGINT and SIGTERM both raise KeyboardInterrupt. SIGINT is set explicitly: a shell that
    starts a job in the background (CI, `make test &`, nohup) leaves SIGINT ignored, and Python then
    never raises KeyboardInterrupt, so the tool would run on through a Ctrl-C; and SIGTERM's default
    ends the process without running any cleanup."""
    with _stop_signals_handled_by(_raise_interrupt):
        yield


@contextmanager
def stop_signals_held(say: Callable[[str], None] = print) -> Iterator[None]:
    """Inside, SIGINT and SIGTERM are noted, not obeyed: for a cleanup that is bounded on its own and
    must finish, such as deleting the namespaces. (A Python handler, not a signal mask: the mask is
    per thread, and a thread torch started would take the signal.) Re-raised as KeyboardInterrupt on
    exit if one came, so the tool still ends as interrupted."""
    arrived: list[int] = []

    def note(signum, frame):
        if not arrived:
            say("still removing what this run started; it ends by itself within seconds")
        arrived.append(signum)

    with _stop_signals_handled_by(note):
        yield
    if arrived:
        raise KeyboardInterrupt
