"""The cohort directory this aggregator signs (:mod:`protocol.cohort_directory`) and serves.

Every tick it reads the members' announcements (one read of a value that grows with the swarm:
the aggregator's, off every peer's round path) and assigns cohorts as peers do. When the members
changed and read alike on two ticks in a row, the last epoch is at least :data:`MIN_EPOCH_SECONDS`
old and governs the attempt the swarm runs (the one after the newest it knows ended), it signs a new
epoch that governs from :data:`LEAD_ATTEMPTS` past that newest attempt (-1 before any), so peers
switch at one attempt boundary;
it re-signs the same directory before the header's DHT copy expires. The DHT holds its newest header
only: ``headers`` asks for those of every epoch it serves. Pages are served by ``<epoch> <cohort>``,
``<epoch> @<peer id>`` for the page that lists a peer (a peer does not know which part of a split
cohort it is in), or ``<epoch> #<index>`` for the page at a leaf index (a peer reading the whole
directory knows only the header's count), for the last :data:`KEPT_EPOCHS` epochs.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable

from hivemind_adapter.dht import store
from hivemind_adapter.p2p import Endpoint
from protocol.cohort_assignment import directory_cohorts
from protocol.cohort_directory import (
    HEADERS_REQUEST,
    CohortDirectory,
    DirectoryError,
    DirectoryHeader,
    DirectoryMember,
    headers_reply,
    parse_page_request,
)
from protocol.dht_schema import directory_key
from protocol.handler_names import directory_handler
from protocol.identity import Identity
from protocol.record_lifetimes import DIRECTORY_TTL
from protocol.records import PeerAnnouncement
from protocol.sealing import seal
from protocol.task_spec import TaskSpec

logger = logging.getLogger(__name__)

TICK_SECONDS = 10.0  # how often the members are read again
MIN_EPOCH_SECONDS = 30.0  # a new epoch at most this often (churn changes the members every tick)
LEAD_ATTEMPTS = 2  # a new epoch governs from this many attempts past the newest one known
KEPT_EPOCHS = 4  # epochs whose pages are served


class DirectoryPublisher:
    """Signs, publishes and serves the task's cohort directory; :meth:`tick` once by hand, or
    :meth:`start` a thread that ticks every :data:`TICK_SECONDS` until :meth:`stop`."""

    def __init__(
        self,
        dht,
        endpoint: Endpoint,
        identity: Identity,
        task: TaskSpec,
        read_announcements: Callable[[], Iterable[PeerAnnouncement]],
        newest_attempt: Callable[[], int],
        withdrawn: Callable[[], frozenset[str]] = frozenset,
    ):
        """``newest_attempt()``: the newest attempt this aggregator knows the swarm in (-1: none)."""
        self.dht, self.endpoint, self.identity, self.task = dht, endpoint, identity, task
        self.read_announcements, self.newest_attempt, self.withdrawn = (
            read_announcements,
            newest_attempt,
            withdrawn,
        )
        self._lock = threading.Lock()  # guards _directories
        self._directories: OrderedDict[int, CohortDirectory] = OrderedDict()  # epoch -> directory
        self._published_at = float("-inf")  # (the ticking thread's) when the newest epoch began
        self._signed_at = float("-inf")  # ... and when its header was last signed
        self._read_before: dict[str, tuple[DirectoryMember, ...]] | None = None  # the previous tick's cohorts
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        endpoint.serve(directory_handler(task.task_id), self._serve_page)

    def newest(self) -> CohortDirectory | None:
        with self._lock:
            return next(reversed(self._directories.values()), None)

    def tick(self, now: float | None = None) -> DirectoryHeader | None:
        """Read the members; publish a new epoch if they changed and read the same on the previous
        tick (and the last epoch is old enough and governs already), or the same one re-signed if
        its header is half its DHT life old. Returns what was published."""
        now = time.monotonic() if now is None else now
        cohorts = directory_cohorts(
            self.read_announcements(), self.withdrawn(), self.task.params.max_group_size
        )
        last = self.newest()
        read = _members_of(cohorts)
        # members read alike twice in a row: peers starting together, or one restarting, are all in
        settled, self._read_before = read == self._read_before, read
        changed = last is None or _members(last) != read
        # one epoch ahead of the swarm at most: the last one governs the attempt it runs (if any)
        newest = self.newest_attempt()
        reached = last is None or newest < 0 or newest + 1 >= last.first_attempt
        if cohorts and changed and settled and reached and now - self._published_at >= MIN_EPOCH_SECONDS:
            # an epoch governs from an attempt boundary ahead of the newest one the swarm ran, or may
            # be running: peers that read its header at different times plan every attempt alike
            first = max(0 if last is None else last.first_attempt + 1, newest + LEAD_ATTEMPTS)
            epoch = max(int(time.time()), last.epoch + 1 if last is not None else 0)
            directory = CohortDirectory(self.task.task_id, epoch, first, cohorts)
            with self._lock:
                self._directories[epoch] = directory
                while len(self._directories) > KEPT_EPOCHS:
                    self._directories.popitem(last=False)
            self._published_at = now
            logger.info(
                f"cohort directory epoch {epoch}: {directory.size} member(s) in {len(directory.names)} "
                f"cohort(s), from attempt {first}"
            )
        elif last is None or now - self._signed_at < DIRECTORY_TTL / 2:
            return None
        directory = self.newest()
        header = directory.header(timestamp=int(time.time() * 1000))
        store(self.dht, directory_key(self.task.task_id), seal(header, self.identity), ttl=DIRECTORY_TTL,
              subkey=self.identity.public_key_hex)  # fmt: skip
        self._signed_at = now
        return header

    async def _serve_page(self, payload: bytes, sender: str) -> bytes:
        if payload == HEADERS_REQUEST:
            with self._lock:
                kept = list(self._directories.values())
            stamp = int(time.time() * 1000)
            return headers_reply([seal(d.header(timestamp=stamp), self.identity) for d in kept])
        try:
            asked = parse_page_request(payload)
        except DirectoryError as e:
            return json.dumps({"error": str(e)}).encode()
        with self._lock:
            directory = self._directories.get(asked.epoch)
        if directory is None:
            return json.dumps({"error": f"no directory of epoch {asked.epoch} here"}).encode()
        if asked.peer_id is not None:
            name, what = directory.cohort_of(asked.peer_id), f"peer {asked.peer_id}"
        elif asked.index is not None:
            name, what = None, f"page {asked.index}"
            if asked.index < len(directory.names):
                name = directory.names[asked.index]
        else:
            name, what = asked.cohort, f"cohort {asked.cohort}"
        if name is None or name not in directory.cohorts:
            return json.dumps({"error": f"no {what} in epoch {asked.epoch}"}).encode()
        return directory.page(name).to_bytes()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="manta-directory", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception as e:  # an unreachable DHT: the next tick tries again
                logger.warning(f"cohort directory not published: {type(e).__name__}: {e}")
            self._stop.wait(TICK_SECONDS)

    def stop(self) -> None:
        """Stop ticking (waits for a tick under way, bounded) and serving pages."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self.endpoint.unserve(directory_handler(self.task.task_id))


def _members(directory: CohortDirectory) -> dict[str, tuple[DirectoryMember, ...]]:
    return dict(directory.cohorts)


def _members_of(cohorts: dict[str, list[DirectoryMember]]) -> dict[str, tuple[DirectoryMember, ...]]:
    return {name: tuple(sorted(set(members))) for name, members in cohorts.items()}
