"""An averager's start bounded, its settings answered or refused, and hivemind's expected timeouts
kept out of the log.

hivemind's ``DecentralizedAverager(start=True)`` waits for its served side to get ready with no
bound, and asks the DHT first; with the DHT gone it never does, and while it waits SIGINT is ignored
in the caller (hivemind sets it so for a forked child to inherit), so not even Ctrl-C would reach it.
:class:`BoundedAveragerProcess` waits :data:`AVERAGER_START_SECONDS` at most (less if the served side
ended or failed: then it fails at once), stops one that did not get ready, and gives the caller its
SIGINT handler back whichever way the start ended. Its settings and steps are bounded the same way.
MANTA serves its averagers from threads (:mod:`hivemind_adapter.in_thread`); this mixin asks only the
``Process`` questions those answer too.

hivemind's expected unawaited timeouts are dropped by
:class:`~hivemind_adapter.task_reports.ExpectedTaskEndings`; any other error is logged.

The lock hivemind makes for the averaged tensors is replaced by a
:class:`~hivemind_adapter.process_locks.DeathSafeLock` before the start, which a holder that dies
(a process killed, or a thread) never leaves held.
"""

from __future__ import annotations

import signal
import threading

from hivemind.utils import MPFuture

from hivemind_adapter.dht import dht_gone
from hivemind_adapter.in_thread import ComponentEnded
from hivemind_adapter.process_answers import NoAnswer, await_answer
from hivemind_adapter.process_locks import DeathSafeLock
from hivemind_adapter.task_reports import quiet_expected_task_endings

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


class BoundedAveragerProcess:
    """Mixin for a ``DecentralizedAverager`` subclass (listed before it), the parent's bounded view of
    the averager's process: ``run_in_background`` waits for it at most :data:`AVERAGER_START_SECONDS`
    (or the ``timeout`` given) and at once fails if it ended, then stops it and raises
    :class:`AveragerStartFailed`; :meth:`ask` and :meth:`check_alive` raise :class:`AveragerGone`."""

    def __init__(self, *args, **kwargs):
        # hivemind's __init__ already asks the DHT's process (for its client mode), unbounded
        dht = kwargs.get("dht", args[1] if len(args) > 1 else None)
        if dht is not None and dht_gone(dht):
            raise AveragerStartFailed("an averager cannot start: its DHT has ended")
        super().__init__(*args, **kwargs)

    def __del__(self):
        if "_parent_pid" in self.__dict__:  # not one whose __init__ stopped before its Process was made
            super().__del__()

    def run_in_background(self, await_ready: bool = True, timeout: float | None = None) -> None:
        in_main_thread = threading.current_thread() is threading.main_thread()
        handler = signal.getsignal(signal.SIGINT) if in_main_thread else None
        try:
            quiet_expected_task_endings()
            self.lock_averaged_tensors = DeathSafeLock()  # before the start: the served side shares it
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
                    f"an averager did not start: {no_answer}" + (" (its DHT has ended)" if dht_ended else "")
                ) from None
            except Exception as failed:  # its own start's error
                dht_ended = dht_gone(self.dht)
                self._stop_unready()
                raise AveragerStartFailed(
                    f"an averager did not start: {failed}" + (" (its DHT has ended)" if dht_ended else "")
                ) from None
        finally:
            if handler is not None:  # None: not a Python-level handler, nothing to give back
                signal.signal(signal.SIGINT, handler)

    def ask(self, method: str, bound: float = ANSWER_SECONDS, **kwargs):
        """Have the averager's served side run ``method(**kwargs, future=...)`` and return its answer.
        hivemind's own calls wait for the answer with no bound; one that ended never gives it, so this
        raises :class:`AveragerGone` as soon as it has ended, or after ``bound``."""
        future = MPFuture()
        try:
            self._outer_pipe.send((method, [], dict(kwargs, future=future)))
            return await_answer(future, self, bound)
        except ComponentEnded:
            raise AveragerGone(
                f"an averager did not answer ({method}): it ended (exit code {self.exitcode})"
            ) from None
        except NoAnswer as no_answer:
            raise AveragerGone(f"an averager did not answer ({method}): {no_answer}") from None

    def check_alive(self) -> None:
        """Raise :class:`AveragerGone` if the averager's served side has ended (a step it was running
        will never finish: its caller would wait for it for ever)."""
        if not self.is_alive():
            raise AveragerGone(f"an averager ended (exit code {self.exitcode})")

    def _stop_unready(self) -> None:
        """Stop the averager that never got ready (it answers no shutdown request)."""
        if self.is_alive():
            self.kill()
        self.join(timeout=10.0)
        remove = getattr(self, "remove_socket_file", None)  # RemovesItsSocket's, when mixed in too
        if remove is not None:
            remove()
