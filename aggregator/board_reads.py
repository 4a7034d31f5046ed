"""What the contribution desk reads of the swarm's DHT board: the peers' signed announcements (each
with its identity binding and announced throughput) and their progress records (the swarm's round).
Every read is bounded, and none runs on the ledger writer."""

from __future__ import annotations

import threading
import time

from aggregator.intake import ContributionIntake
from hivemind_adapter.dht import read_signed
from protocol.corroboration import corroborated_max
from protocol.dht_schema import open_peer_value, open_progress_value, peers_key, progress_key
from protocol.records import IdentityBinding, PeerAnnouncement
from protocol.sealing import Sealed
from protocol.verified_records import VerifiedRecords

BINDINGS_REFRESH = 10.0  # seconds a read of the peers' announcements serves receipts for

Announced = tuple[Sealed[PeerAnnouncement], Sealed[IdentityBinding]]


class AnnouncementReader:
    """The peers' announcements of one task, each entry's signatures checked the first time it is
    seen only. :meth:`read` and :meth:`for_sender` may run on any thread; :meth:`learn` and
    ``throughput`` belong to the ledger writer (they feed the intake it owns)."""

    def __init__(self, dht, task_id: str):
        self.dht, self.task_id = dht, task_id
        self._announcements = VerifiedRecords(lambda sub, value: open_peer_value(task_id, sub, value))
        self._lock = threading.Lock()  # guards _read_at and _bound
        self._read_at = float("-inf")
        self._bound: set[str] = set()  # peer ids whose binding the intake holds
        self.throughput: dict[str, float] = {}  # peer id -> announced samples/s

    def read(self) -> list[Announced]:
        """Every valid announcement on the board now (a bounded DHT read)."""
        found = read_signed(self.dht, peers_key(self.task_id), self._announcements.open)
        with self._lock:
            self._read_at = time.monotonic()
        return found

    def for_sender(self, sender: str) -> list[Announced]:
        """What a receipt from ``sender`` needs read first: nothing if the last read, younger than
        :data:`BINDINGS_REFRESH`, already bound the sender; else a fresh read."""
        with self._lock:
            fresh = time.monotonic() - self._read_at < BINDINGS_REFRESH
            if fresh and sender in self._bound:
                return []
        return self.read()

    def learn(self, announcements: list[Announced], intake: ContributionIntake) -> None:
        """Give ``intake`` the bindings of ``announcements`` and keep their announced throughput; only
        then may a receipt from those peers skip the read (a ledger-writer job)."""
        for announcement, binding in announcements:
            intake.bindings[binding.record.peer_id] = binding
            with self._lock:
                self._bound.add(binding.record.peer_id)
            if announcement.record.throughput_milli > 0:
                self.throughput[announcement.record.peer_id] = announcement.record.throughput_milli / 1000


def read_swarm_round(dht, task_id: str, announced: int) -> int:
    """The newest round that two peers' progress records show (-1: none), from a bounded DHT read.
    ``announced``: how many peers the roster holds (0: its read failed). A lone record stands only
    in a swarm of two, so one peer's far-off round cannot push every receipt out of the window."""
    records = read_signed(
        dht, progress_key(task_id), lambda sub, value: open_progress_value(task_id, sub, value)
    )
    return corroborated_max(
        ((r.record.peer_id, r.record.round) for r in records), lone_stands=0 < announced <= 2
    )
