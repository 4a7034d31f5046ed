"""The monitor's background thread: every ``interval`` seconds, read the swarm and refresh the views.

Each tick reads the DHT once (:func:`~aggregator.monitor.swarm_reader.read_swarm`), folds the reading
into :class:`~aggregator.monitor.aggregates.SwarmAggregates`, then runs the other periodic jobs
(refresh the ledger summary, start the evaluation of a new checkpoint). A failing tick (the DHT is
shutting down, a lookup timed out) is logged and retried on the next one: the monitor must never take
the aggregator down.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from aggregator.monitor.aggregates import SwarmAggregates
from aggregator.monitor.swarm_reader import SwarmReading

logger = logging.getLogger(__name__)

# Peers re-publish progress every second and a short round lasts a few seconds, so a reading every
# second sees every round (and the last report of most of them) at the cost of two local DHT lookups.
DEFAULT_INTERVAL = 1.0


class Collector:
    def __init__(
        self,
        read: Callable[[], SwarmReading],
        aggregates: SwarmAggregates,
        *,
        interval: float = DEFAULT_INTERVAL,
        jobs: tuple[Callable[[], object], ...] = (),
    ):
        self.read, self.aggregates, self.interval, self.jobs = read, aggregates, interval, jobs
        self.last_error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def tick(self) -> None:
        """One reading and one run of every job (what the thread does every ``interval`` s)."""
        try:
            reading = self.read()
            self.aggregates.observe(reading, time.time())
            self.last_error = None
        except Exception as e:  # a transient DHT failure; the next tick retries
            self.last_error = f"reading the DHT failed: {type(e).__name__}: {e}"
            logger.debug(self.last_error)
        for job in self.jobs:
            try:
                job()
            except Exception as e:  # a job's own failure must not stop the readings
                logger.warning(f"monitor job {getattr(job, '__qualname__', job)} failed: {e}")

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="manta-monitor", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            self.tick()
            self._stop.wait(max(0.1, self.interval - (time.monotonic() - started)))

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
