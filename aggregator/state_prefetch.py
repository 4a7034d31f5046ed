"""Fetching a queued receipt's start state (and the state after its group) in the background, while
the peers that hold it are online. Why: an audit runs later, and one whose start state cannot be had
revokes the receipt; the last state of a run is served only until its holders leave."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

REMEMBERED = 64  # start states remembered as fetched (each is fetched once)
FETCH_TIMEOUT = 30.0  # seconds one fetch may take


class StatePrefetcher:
    """Fetches each start state once (of the last :data:`REMEMBERED`), on one background thread,
    through ``states.state_for(digest, timeout)``. :meth:`prefetch` may be called from any thread."""

    def __init__(self, states):
        self.states = states
        self._prefetched: dict[str, None] = {}  # digests fetched, oldest first
        self._lock = threading.Lock()  # guards _prefetched
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="manta-audit-prefetch")

    def prefetch(self, digest: str) -> None:
        """Queue a fetch of the state ``digest`` unless one was queued before."""
        with self._lock:
            if digest in self._prefetched:
                return
            self._prefetched[digest] = None
            while len(self._prefetched) > REMEMBERED:
                self._prefetched.pop(next(iter(self._prefetched)))
        self._executor.submit(self.states.state_for, digest, FETCH_TIMEOUT)

    def run(self, job: Callable[[], object]) -> None:
        """Run ``job`` on the same background thread, after what is queued (its errors are dropped:
        a fetch that fails is simply not in the cache)."""
        self._executor.submit(job)

    def shutdown(self) -> None:
        """Drop the queued fetches; the one running finishes on its own."""
        self._executor.shutdown(wait=False, cancel_futures=True)
