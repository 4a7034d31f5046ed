"""Waiting for an answer from one of hivemind's processes, bounded, and cut short by its death.

hivemind's DHT and averagers each run in their own process and answer their parent through an
``MPFuture``: readiness at start, then every setting and call. hivemind waits for those answers with
no bound, and a process that was killed (by a user, the OOM killer, a test) never gives one, so its
parent would wait for good. :func:`await_answer` is the one wait MANTA uses instead: it polls the future,
checks between polls whether the process is still running, and gives up at a deadline.

Between calls nothing waits on such a process, so a death would go unnoticed until the next call, or
for good where no call comes (a state sharer only serves). :class:`ProcessWatch` notices it within a
second and tells its owner once.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import threading
import time
from collections.abc import Callable
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


class ProcessWatch:
    """Calls ``on_death(exit_code)`` once, from a thread of its own, when ``process`` (a DHT's, an
    averager's, a state sharer's) has ended while the watch runs. Without its DHT's process a node can
    neither find partners nor read or post a record, and hivemind's calls on it wait forever; without
    its state sharer's, it silently serves no state and fetches none. Stop the watch before shutting
    the process down on purpose."""

    def __init__(
        self,
        process: multiprocessing.process.BaseProcess,
        on_death: Callable[[int | None], None],
        every: float = 1.0,
    ):
        self._process, self._on_death, self._every = process, on_death, every
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="process-watch", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stopped.wait(self._every):
            if not self._process.is_alive():
                if not self._stopped.is_set():
                    self._on_death(self._process.exitcode)
                return

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=2 * self._every + 1.0)
