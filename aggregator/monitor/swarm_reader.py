"""What the monitor reads from the DHT: peers' announcements and progress records, re-verified.

Every node of the task runs the record validator, but a node without it (or the local cache) may
still hand back anything, so each entry is opened again here (signature, schema, task, owner) and
dropped if it fails. The aggregator may not import ``peer/``, so this is its own small reader over
:mod:`protocol.dht_schema`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hivemind_adapter.dht import read_entries
from protocol.dht_schema import open_peer_value, open_progress_value, peers_key, progress_key
from protocol.records import PeerAnnouncement, PeerProgress
from protocol.sealing import RecordRejected


@dataclass(frozen=True)
class SwarmReading:
    """One look at the DHT: the verified records present now (expired ones are gone from the DHT)."""

    announcements: tuple[PeerAnnouncement, ...]
    progress: tuple[PeerProgress, ...]
    rejected: int  # entries that failed verification in this reading


_entries = read_entries


def read_swarm(dht: Any, task_id: str, aggregator_keys: frozenset[str] | None = None) -> SwarmReading:
    """Read and verify the announcements of members and the progress records of ``task_id`` (one
    DHT lookup each); ``aggregator_keys``: the task's, that sign membership certificates."""
    announcements, progress, rejected = [], [], 0
    for subkey, value in _entries(dht, peers_key(task_id)).items():
        try:
            entry = open_peer_value(task_id, subkey, value, aggregator_keys)
        except RecordRejected:
            rejected += 1
            continue
        announcements.append(entry.announcement.record)
    for subkey, value in _entries(dht, progress_key(task_id)).items():
        try:
            progress.append(open_progress_value(task_id, subkey, value).record)
        except RecordRejected:
            rejected += 1
    return SwarmReading(tuple(announcements), tuple(progress), rejected)
