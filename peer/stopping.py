"""What Ctrl-C (and SIGTERM) mean to a volunteer's agent.

The first asks the peer to leave: it closes its computation early, finishes the round's averaging
(the others count on its share), catches up with a round the swarm is finishing, and leaves. A second
one during the round abandons it at once; a second one during that last catch-up ends the wait and
leaves with the state the peer holds.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

logger = logging.getLogger("manta.peer")


class StopSignals:
    """The agent's stop request (``stop``), and a second one while it waits to leave (``leave_now``)."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.leave_now = threading.Event()
        self._waiting_to_leave = False
        self._installed = False

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

    def _on_signal(self, signum, frame) -> None:
        if self.stop.is_set() and self._waiting_to_leave:
            self.leave_now.set()  # after the round: leave with the state this peer holds
            return
        if self.stop.is_set():
            raise KeyboardInterrupt  # during the round: abandon it now
        logger.info("stopping after this round (Ctrl-C again to abandon it)")
        self.stop.set()
