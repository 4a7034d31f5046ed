"""Fetching a queued receipt's start state (and the state after its group) in the background, while
the peers that hold it are online (they keep a few rounds' states). Why: an audit runs later, maybe
rounds later, and the last state of a run is served only until its holders leave."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

REMEMBERED = 64  # start states remembered as fetched (each is fetched once)
FETCH_TIMEOUT = 30.0  # seconds one fetch may take
RETRY_AFTER = (5.0, 15.0)  # seconds before each new try of a fetch that failed (pages it got are kept)


class StatePrefetcher:
    """Fetches each state once (of the last :data:`REMEMBERED`), on one background thread: what an
    audit replays from (``states.start_state``) or the whole state (``states.state_for``); a fetch
    that failed is tried again :data:`RETRY_AFTER` seconds later. Callable from any thread."""

    def __init__(self, states):
        self.states = states
        self._prefetched: dict[tuple[str, bool], None] = {}  # (digest, whole) fetched, oldest first
        self._retries: list[tuple[float, str, bool, int]] = []  # (due, digest, whole, tries) that failed
        self._lock = threading.Lock()  # guards _prefetched and _retries
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="manta-audit-prefetch")

    def prefetch(self, digest: str, whole: bool = False) -> None:
        """Queue a fetch of what an audit replays from the state ``digest`` (``whole``: of the whole
        state) unless one was queued before."""
        with self._lock:
            if (digest, whole) in self._prefetched:
                return
            self._prefetched[digest, whole] = None
            while len(self._prefetched) > REMEMBERED:
                self._prefetched.pop(next(iter(self._prefetched)))
        self._executor.submit(self._fetch, digest, whole, 0)

    def _fetch(self, digest: str, whole: bool, tries: int) -> None:
        fetch = self.states.state_for if whole else self.states.start_state
        if fetch(digest, FETCH_TIMEOUT) is not None or tries >= len(RETRY_AFTER):
            return
        due = time.monotonic() + RETRY_AFTER[tries]
        with self._lock:
            self._retries.append((due, digest, whole, tries + 1))

    def retry_due(self) -> None:
        """Queue the fetches whose retry is due (the desk calls this every second)."""
        now = time.monotonic()
        with self._lock:
            due = [r for r in self._retries if r[0] <= now]
            self._retries = [r for r in self._retries if r[0] > now]
        for _, digest, whole, tries in due:
            try:
                self._executor.submit(self._fetch, digest, whole, tries)
            except RuntimeError:  # shut down
                return

    def run(self, job: Callable[[], object]) -> None:
        """Run ``job`` on the same background thread, after what is queued (its errors are dropped:
        a fetch that fails is simply not in the cache)."""
        self._executor.submit(job)

    def shutdown(self) -> None:
        """Drop the queued fetches; the one running finishes on its own."""
        self._executor.shutdown(wait=False, cancel_futures=True)
