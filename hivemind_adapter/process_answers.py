"""Waiting for an answer from one of hivemind's processes, bounded, and cut short by its death.

hivemind's DHT and averagers each run in their own process and answer their parent through an
``MPFuture``: readiness at start, then every setting and call. hivemind waits for those answers with
no bound, and a process that was killed (by a user, the OOM killer, a test) never gives one, so its
parent hung for good. :func:`await_answer` is the one wait MANTA uses instead: it polls the future,
checks between polls whether the process is still running, and gives up at a deadline.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import time
from typing import Any

from hivemind.utils import MPFuture

# How often a wait checks that the process it waits on is alive: a death is noticed within this.
POLL_SECONDS = 0.5


class NoAnswer(RuntimeError):
    """A process did not answer; the caller turns this into its own one-line error."""


class ProcessEnded(NoAnswer):
    """The process ended before it answered: it never will."""

    def __init__(self, exitcode: int | None):
        super().__init__(f"its process ended (exit code {exitcode})")
        self.exitcode = exitcode


class NoAnswerWithin(NoAnswer):
    """The process is alive but did not answer within the bound (stuck, or far too loaded)."""

    def __init__(self, bound: float):
        super().__init__(f"its process did not answer within {bound:.0f} s")
        self.bound = bound


def await_answer(future: MPFuture, process: multiprocessing.process.BaseProcess, bound: float) -> Any:
    """The result ``process`` sets on ``future``, waiting ``bound`` seconds at most.

    Raises what the process reported as its error, :class:`ProcessEnded` once it ended without an
    answer (an answer it sent just before ending is still returned), or :class:`NoAnswerWithin`."""
    deadline = time.monotonic() + bound
    while True:
        left = deadline - time.monotonic()
        try:
            return future.result(timeout=max(0.0, min(POLL_SECONDS, left)))
        except TimeoutError:
            pass
        if not process.is_alive():
            # the pipe may still hold what it sent as it ended: its answer, or the error it ended on
            with contextlib.suppress(TimeoutError):
                return future.result(timeout=1.0)
            raise ProcessEnded(process.exitcode)
        if left <= 0:
            raise NoAnswerWithin(bound)
