"""What Ctrl-C (and SIGTERM) mean to a volunteer's agent.

The first asks the peer to leave: it closes its computation early, finishes the round's averaging
(the others count on its share), catches up with a round the swarm is finishing, and leaves. A second
one during the round abandons it at once; a second one during that last catch-up ends the wait and
leaves with the state the peer holds.

A peer that lost its DHT's process cannot go on at all: :meth:`StopSignals.lose` interrupts the main
thread wherever it waits and raises :class:`SwarmLost` there, as a second Ctrl-C would abandon the
round, so the peer shuts down and says why in one line.
"""

from __future__ import annotations

import _thread
import logging
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

logger = logging.getLogger("manta.peer")

LOSS_REPEAT_SECONDS = 2.0  # a lost swarm interrupts the main thread again this often until it stops


class SwarmLost(BaseException):
    """Raised in the main thread when the peer can no longer reach the swarm (its DHT's process
    ended). A BaseException, as KeyboardInterrupt is: no ``except Exception`` on the way may swallow
    it and carry on with a peer that can do nothing."""


class StopSignals:
    """The agent's stop request (``stop``), and a second one while it waits to leave (``leave_now``)."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.leave_now = threading.Event()
        self._waiting_to_leave = False
        self._installed = False
        self._lost: str | None = None  # why the swarm is lost, once it is
        self._lost_raised = threading.Event()

    def install(self) -> None:
        """Handle SIGINT and SIGTERM in this (the main) thread.

        Called again after every hivemind averager is created (:meth:`reclaim`): hivemind's
        ``run_in_background`` sets SIGINT to "ignore" in the *calling* process before it forks the
        averager, which would otherwise leave the volunteer with a peer that Ctrl-C cannot stop."""
        self._installed = True
        signal.signal(signal.SIGINT, self._on_signal)
        signal.signal(signal.SIGTERM, self._on_signal)

    def reclaim(self) -> None:
        """Install the handlers again if they were installed once (see :meth:`install`)."""
        if self._installed and threading.current_thread() is threading.main_thread():
            self.install()

    @contextmanager
    def waiting_to_leave(self) -> Iterator[threading.Event]:
        """While the peer waits, after its last round, to leave with the swarm's state: a second
        signal sets the event yielded instead of abandoning anything."""
        self._waiting_to_leave = True
        try:
            yield self.leave_now
        finally:
            self._waiting_to_leave = False

    def lose(self, reason: str) -> None:
        """From any thread: the peer cannot go on (logged once; later calls do nothing). Interrupts the
        main thread (again every :data:`LOSS_REPEAT_SECONDS` while hivemind has SIGINT ignored there,
        as it does while it starts an averager) until it has raised :class:`SwarmLost`."""
        if self._lost is not None:
            return  # told once
        self._lost = reason
        logger.error(reason)
        self.stop.set()
        if not self._installed:
            return  # no handler of ours to raise it (an embedding program's): the round loop sees stop
        while not self._lost_raised.is_set():
            _thread.interrupt_main(signal.SIGINT)
            self._lost_raised.wait(LOSS_REPEAT_SECONDS)

    @property
    def lost(self) -> str | None:
        """Why the peer cannot go on, once :meth:`lose` was told (None until then)."""
        return self._lost

    def closing(self) -> None:
        """The peer shuts down now: a loss not raised yet is not raised any more (nor interrupts)."""
        self._lost_raised.set()

    def _on_signal(self, signum, frame) -> None:
        if self._lost is not None and not self._lost_raised.is_set():
            self._lost_raised.set()
            raise SwarmLost(self._lost)
        if self.stop.is_set() and self._waiting_to_leave:
            self.leave_now.set()  # after the round: leave with the state this peer holds
            return
        if self.stop.is_set():
            raise KeyboardInterrupt  # during the round: abandon it now
        logger.info("stopping after this round (Ctrl-C again to abandon it)")
        self.stop.set()
