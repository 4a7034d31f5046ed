"""An averager's process: its start bounded, and hivemind's expected timeouts kept out of the log.

hivemind's ``DecentralizedAverager(start=True)`` forks the averager's process and waits for it to be
ready with no bound. The process gets ready only after its first calls to the DHT's process (it
replicates the DHT's p2p client), so with that process gone it never does, and its parent waits
forever. While it waits, SIGINT is ignored in the parent (hivemind sets it so before the fork, for the
child to inherit), so not even Ctrl-C would reach it.

:class:`BoundedAveragerProcess` waits :data:`AVERAGER_START_SECONDS` at most (less if the process
ended: then it fails at once), stops a process that did not get ready, and gives the parent its
SIGINT handler back whichever way the start ended. Its settings and steps are bounded the same way.

In the averager's process, hivemind re-declares the averager for state downloads every period in a
task nobody awaits, bounded by ``asyncio.wait_for``. When the DHT does not answer in time (its process
ended, or it is overloaded), asyncio logs each such task's TimeoutError with a full traceback, "Task
exception was never retrieved", every 30 s per averager: the next declaration is the retry, and
nothing is lost. :class:`UnawaitedTimeouts` drops exactly those records; any other error is logged.

The lock hivemind makes for the averaged tensors, shared by the parent and the averager's process,
is a semaphore that a process killed while holding it (stopped the hard way here, or by the OOM
killer) leaves held for ever, and the parent's next ``get_tensors`` then hangs; it is replaced by a
:class:`~hivemind_adapter.process_locks.DeathSafeLock` before the fork.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading

from hivemind.utils import MPFuture

from hivemind_adapter.dht import dht_gone
from hivemind_adapter.process_answers import NoAnswer, await_answer
from hivemind_adapter.process_locks import DeathSafeLock

# An averager gets ready within seconds, even under load; a minute is far past any start that will
# still succeed.
AVERAGER_START_SECONDS = 60.0


# How long the parent waits for its averager's process to answer a setting (the process answers
# between the steps of its event loop, well within a second).
ANSWER_SECONDS = 60.0


class AveragerStartFailed(RuntimeError):
    """An averager's process did not get ready within its bound; one line for the user."""


class AveragerGone(RuntimeError):
    """An averager's process ended (killed, out of memory) or stopped answering: what the parent asked
    of it, or the step it waits for, will never come; one line for the user."""


class UnawaitedTimeouts(logging.Filter):
    """Drops asyncio's report of a task nobody awaited that ended in ``wait_for``'s TimeoutError."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        message = record.getMessage()
        unawaited = message.startswith("Task exception was never retrieved") and "coro=<wait_for()" in message
        return not (unawaited and isinstance(error, (TimeoutError, asyncio.TimeoutError)))


class BoundedAveragerProcess:
    """Mixin for a ``DecentralizedAverager`` subclass (listed before it), the parent's bounded view of
    the averager's process: ``run_in_background`` waits for it at most :data:`AVERAGER_START_SECONDS`
    (or the ``timeout`` given) and at once fails if it ended, then stops it and raises
    :class:`AveragerStartFailed`; :meth:`ask` and :meth:`check_alive` raise :class:`AveragerGone`."""

    def __init__(self, *args, **kwargs):
        # hivemind's __init__ already asks the DHT's process (for its client mode), unbounded
        dht = kwargs.get("dht", args[1] if len(args) > 1 else None)
        if dht is not None and dht_gone(dht):
            raise AveragerStartFailed("an averager cannot start: its DHT's process has ended")
        super().__init__(*args, **kwargs)

    def __del__(self):
        if "_parent_pid" in self.__dict__:  # not one whose __init__ stopped before its Process was made
            super().__del__()

    def run_in_background(self, await_ready: bool = True, timeout: float | None = None) -> None:
        in_main_thread = threading.current_thread() is threading.main_thread()
        handler = signal.getsignal(signal.SIGINT) if in_main_thread else None
        try:
            self.lock_averaged_tensors = DeathSafeLock()  # before the fork: the process shares it
            super().run_in_background(await_ready=False)
            if not await_ready:
                return
            bound = AVERAGER_START_SECONDS if timeout is None else timeout
            try:
                await_answer(self._ready, self, bound)  # raises the start's own error, if it failed
            except NoAnswer as no_answer:
                dht_ended = dht_gone(self.dht)
                self._stop_unready()
                raise AveragerStartFailed(
                    f"an averager did not start: {no_answer}"
                    + (" (its DHT's process has ended)" if dht_ended else "")
                ) from None
        finally:
            if handler is not None:  # None: not a Python-level handler, nothing to give back
                signal.signal(signal.SIGINT, handler)

    def ask(self, method: str, bound: float = ANSWER_SECONDS, **kwargs):
        """Have the averager's process run ``method(**kwargs, future=...)`` and return its answer.
        hivemind's own calls wait for the answer with no bound; a process that ended never gives one,
        so this raises :class:`AveragerGone` as soon as the process has ended, or after ``bound``."""
        future = MPFuture()
        self._outer_pipe.send((method, [], dict(kwargs, future=future)))
        try:
            return await_answer(future, self, bound)
        except NoAnswer as no_answer:
            raise AveragerGone(f"an averager did not answer ({method}): {no_answer}") from None

    def check_alive(self) -> None:
        """Raise :class:`AveragerGone` if the averager's process has ended (a step it was running will
        never finish: its parent waited for it for ever)."""
        if not self.is_alive():
            raise AveragerGone(f"an averager's process ended (exit code {self.exitcode})")

    def run(self) -> None:
        # the averager's process starts here
        logging.getLogger("asyncio").addFilter(UnawaitedTimeouts())
        super().run()

    def _stop_unready(self) -> None:
        """Stop the averager's process that never got ready (it answers no shutdown request)."""
        if self.is_alive():
            self.kill()
        self.join(timeout=10.0)
        remove = getattr(self, "remove_socket_file", None)  # RemovesItsSocket's, when mixed in too
        if remove is not None:
            remove()
