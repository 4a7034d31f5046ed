"""The roster: the members offering work on a task, as one peer sees them.

A read of the roster's key merges the entries that the nodes of one lookup hold. On a loaded
machine some of them do not answer in time, and the read misses live peers (at 64 thin peers on two
cores, reads held 2 to 64 of the 64). A peer that takes such a read for the roster assigns cohorts
that its mates do not, and counts the peers it missed as gone. :class:`RosterView` merges every
read into what the earlier ones returned: each member's newest announcement is kept until the
DHT's expiration of it, so a read adds and refreshes members, and only time, a newer announcement
(a withdrawal) or an aggregator's withdrawal removes one.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from hivemind_adapter.dht import read_entries, read_expiring_entries
from protocol.cohort_assignment import RosterEntry
from protocol.dht_schema import open_peer_value, open_withdrawal_value, peers_key, withdrawals_key
from protocol.record_lifetimes import ANNOUNCE_TTL, EXPIRY_SLACK_SECONDS
from protocol.records import PeerAnnouncement
from protocol.sealing import RecordRejected
from protocol.task_spec import TaskSpec
from protocol.verified_records import VerifiedRecords

logger = logging.getLogger(__name__)

# Matchmaking admits the roster its round was planned on, if read this recently (else it reads again).
ADMISSION_READ_AGE = 20.0


@dataclass(frozen=True)
class RosterPeer:
    entry: RosterEntry
    workers: int
    announcement: PeerAnnouncement


@dataclass(frozen=True)
class LiveAnnouncement:
    """A verified announcement and the time (seconds since the epoch) it stops counting: the DHT's
    expiration of its copy, never later than its signed time allows."""

    announcement: PeerAnnouncement
    workers: int
    expires: float

    def newer_than(self, other: LiveAnnouncement) -> bool:
        return (self.announcement.timestamp, self.expires) > (other.announcement.timestamp, other.expires)


# Announcements are re-read every round and re-sent unchanged between refreshes: verified once each.
_announcements = VerifiedRecords(lambda where, value: open_peer_value(where[0], where[2], value, where[1]))
WITHDRAWALS_READ_EVERY = 30.0  # seconds a read of the task's withdrawn memberships serves rosters for
_withdrawals_lock = threading.Lock()  # guards _withdrawals
_withdrawals: dict[str, tuple[float, frozenset[str]]] = {}  # task id -> (read at, keys withdrawn)


def withdrawn_members(dht, task: TaskSpec) -> frozenset[str]:
    """The keys an aggregator of ``task`` withdrew from it (read at most every
    :data:`WITHDRAWALS_READ_EVERY` seconds)."""
    with _withdrawals_lock:
        read_at, keys = _withdrawals.get(task.task_id, (float("-inf"), frozenset()))
    if time.monotonic() - read_at < WITHDRAWALS_READ_EVERY:
        return keys
    signers, now = frozenset(task.aggregator_keys), time.time() * 1000
    found = set()
    for sub, value in read_entries(dht, withdrawals_key(task.task_id)).items():
        try:
            withdrawal = open_withdrawal_value(task.task_id, sub, value, signers).record
        except RecordRejected:
            continue
        if withdrawal.until_ms > now:
            found.add(withdrawal.member_key)
    with _withdrawals_lock:
        _withdrawals[task.task_id] = (time.monotonic(), frozenset(found))
    return frozenset(found)


def read_announcements(dht, task: TaskSpec) -> dict[str, LiveAnnouncement]:
    """Public key (hex) -> the verified announcement one read of ``task``'s roster key returned (each
    with a live certificate of one of its aggregators)."""
    signers = frozenset(task.aggregator_keys)
    out = {}
    for sub, (value, dht_expires) in read_expiring_entries(dht, peers_key(task.task_id)).items():
        try:
            a = _announcements.open((task.task_id, signers, sub), value).announcement.record
        except RecordRejected:
            continue
        signed_expires = a.timestamp / 1000 + ANNOUNCE_TTL + EXPIRY_SLACK_SECONDS
        out[a.public_key] = LiveAnnouncement(a, len(a.devices), min(dht_expires, signed_expires))
    return out


def roster_of(
    announcements: dict[str, LiveAnnouncement], withdrawn: frozenset[str], now: float
) -> list[RosterPeer]:
    """The members ``announcements`` show offering work at ``now`` (not withdrawn by an aggregator,
    not expired), sorted by peer id. A peer id that two keys claim is left out: only its libp2p key's
    holder can endorse both."""
    peers, keys = {}, {}
    for live in announcements.values():
        if live.expires <= now:
            continue
        a = live.announcement
        keys.setdefault(a.peer_id, set()).add(a.public_key)
        if a.throughput_milli == 0 or a.public_key in withdrawn:
            continue
        explicit = None if a.cohort_id.startswith("auto") else a.cohort_id
        entry = RosterEntry(a.peer_id, a.affinity.host_id, a.affinity.network_id, explicit)
        peers[a.peer_id] = RosterPeer(entry, live.workers, a)
    return [peers[k] for k in sorted(peers) if len(keys[k]) == 1]


def read_roster(dht, task: TaskSpec) -> list[RosterPeer]:
    """The members one read of the DHT shows offering work on ``task`` (see :func:`roster_of`); a
    peer that reads the roster on every round keeps a :class:`RosterView` instead."""
    return roster_of(read_announcements(dht, task), withdrawn_members(dht, task), time.time())


class RosterView:
    """One peer's roster of ``task``: every read merged into the earlier ones (the module's doc)."""

    def __init__(self, dht, task: TaskSpec):
        self.dht, self.task = dht, task
        self._lock = threading.Lock()  # guards _seen and _read_at
        self._seen: dict[str, LiveAnnouncement] = {}  # public key -> its newest announcement read
        self._read_at = float("-inf")  # time.monotonic() of the last read that returned any entry

    def read(self) -> list[RosterPeer]:
        """Read the DHT now; the roster it and the earlier reads show."""
        found = read_announcements(self.dht, self.task)
        now = time.time()
        roster = self.merge(found, withdrawn_members(self.dht, self.task), now)
        ages = sorted(now - live.announcement.timestamp / 1000 for live in found.values()) or [0.0]
        logger.debug(
            f"roster: {len(roster)} peers; this read {len(found)} announcements, signed {ages[0]:.1f}-{ages[-1]:.1f} s ago"
        )
        return roster

    def merge(
        self, found: dict[str, LiveAnnouncement], withdrawn: frozenset[str], now: float
    ) -> list[RosterPeer]:
        """Merge one read's announcements (``found``) into the view; the roster at ``now``."""
        with self._lock:
            for key, live in found.items():
                held = self._seen.get(key)
                if held is None or live.newer_than(held):
                    self._seen[key] = live
            for key in [k for k, held in self._seen.items() if held.expires <= now]:
                del self._seen[key]
            if found:
                self._read_at = time.monotonic()
            return roster_of(self._seen, withdrawn, now)

    def recent(self, max_age: float) -> list[RosterPeer]:
        """The roster as of a read at most ``max_age`` seconds old (one read now, if there is none)."""
        with self._lock:
            fresh = time.monotonic() - self._read_at <= max_age
            seen = dict(self._seen)
        if not fresh:
            return self.read()
        return roster_of(seen, withdrawn_members(self.dht, self.task), time.time())

    def peer_ids(self) -> list[str]:
        """The roster's peer ids, read now."""
        return [p.entry.peer_id for p in self.read()]

    def keys(self, max_age: float) -> dict[str, str]:
        """Peer id -> public key (hex) of the roster's members, as of :meth:`recent`."""
        return {p.entry.peer_id: p.announcement.public_key for p in self.recent(max_age)}
