"""What the contribution desk reads of the swarm's DHT board: the peers' signed announcements (their
announced throughput; the desk learns bindings from the senders themselves) and their progress
records (the swarm's round). Every read is bounded, and none runs on the ledger writer."""

from __future__ import annotations

import threading
from collections.abc import Callable

from hivemind_adapter.dht import read_signed
from protocol.corroboration import corroborated_max
from protocol.dht_schema import PeerEntry, open_peer_value, open_progress_value, peers_key, progress_key
from protocol.verified_records import VerifiedRecords


class AnnouncementReader:
    """The peers' announcements of one task, each entry's signatures checked the first time it is
    seen only. :meth:`read` may run on any thread; :meth:`learn` and ``throughput`` belong to the
    ledger writer."""

    def __init__(self, dht, task_id: str, aggregator_keys: frozenset[str]):
        self.dht, self.task_id = dht, task_id
        self._announcements = VerifiedRecords(
            lambda sub, value: open_peer_value(task_id, sub, value, aggregator_keys)
        )
        self.throughput: dict[str, float] = {}  # peer id -> announced samples/s
        self._lock = threading.Lock()  # guards _members
        self._members: set[str] = set()  # keys seen announced with a live certificate, ever

    def read(self) -> list[PeerEntry]:
        """Every valid announcement of a member on the board now (a bounded DHT read)."""
        found = read_signed(self.dht, peers_key(self.task_id), self._announcements.open)
        with self._lock:
            self._members.update(e.announcement.record.public_key for e in found)
        return found

    def seen_member(self, key: str) -> bool:
        """Whether ``key`` was ever read announced with a live certificate (any aggregator's)."""
        with self._lock:
            return key in self._members

    def learn(self, announcements: list[PeerEntry]) -> None:
        """Keep the announced throughput of ``announcements`` (a ledger-writer job)."""
        for entry in announcements:
            announcement = entry.announcement.record
            if announcement.throughput_milli > 0:
                self.throughput[announcement.peer_id] = announcement.throughput_milli / 1000


def read_swarm_round(
    dht, task_id: str, announced: int, is_member: Callable[[str], bool] = lambda key: True
) -> int:
    """The newest round that two members' progress records show (-1: none), from a bounded DHT read.
    ``announced``: how many peers the roster holds (0: its read failed). A lone record stands only
    in a swarm of two, so one peer's far-off round cannot push every receipt out of the window; a
    record of a key that is no member (``is_member``) counts for nothing."""
    records = read_signed(
        dht, progress_key(task_id), lambda sub, value: open_progress_value(task_id, sub, value)
    )
    return corroborated_max(
        ((r.record.peer_id, r.record.round) for r in records if is_member(r.record.public_key)),
        lone_stands=0 < announced <= 2,
    )
