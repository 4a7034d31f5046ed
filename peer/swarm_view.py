"""What a peer reads from and writes to the DHT: the task, its own announcement, progress (the
roster: :mod:`peer.roster_view`).

Everything read is re-verified here (signature, schema, task) even though every node's validator
already filters, because a node without validators (or this node's own cache) may still hand back
anything.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from hivemind_adapter.dht import read_entries, store
from peer.membership import sealed_binding
from protocol.dht_schema import (
    TASKS_INDEX_KEY,
    open_index_value,
    open_progress_value,
    open_task_value,
    peers_key,
    progress_key,
    task_key,
)
from protocol.peer_keys import Speaker
from protocol.record_lifetimes import ANNOUNCE_TTL, PROGRESS_TTL
from protocol.records import Affinity, DeviceInfo, PeerAnnouncement, PeerProgress
from protocol.sealing import RecordRejected, Sealed, seal
from protocol.task_spec import TaskSpec
from protocol.verified_records import VerifiedRecords

logger = logging.getLogger(__name__)


class TaskNotFound(LookupError):
    """No usable task (one line for the volunteer)."""


_entries = read_entries


def fetch_task(
    dht, task_id: str | None, aggregator_key: str | None = None, wait: float = 30.0
) -> Sealed[TaskSpec]:
    """The verified TaskSpec of ``task_id`` (or of the only published task), waiting up to ``wait`` s
    (a fresh node's first reads can take seconds on a loaded machine: each read may use what is left)."""
    deadline = time.monotonic() + wait
    while True:
        left = max(1.0, deadline - time.monotonic())
        if task_id is None:
            index = {}
            for sub, value in _entries(dht, TASKS_INDEX_KEY, left).items():
                try:
                    index[sub] = open_index_value(sub, value)
                except RecordRejected:
                    continue
            if len(index) > 1:
                raise TaskNotFound(
                    f"several tasks are published ({', '.join(sorted(index))}); choose one with --task"
                )
            candidates = list(index.values())
            if candidates:
                task_id = candidates[0].record.task_id
        if task_id is not None:
            specs = []
            for sub, value in _entries(dht, task_key(task_id), left).items():
                try:
                    specs.append(open_task_value(task_id, sub, value))
                except RecordRejected as e:
                    logger.warning(f"ignoring an invalid task record: {e}")
            if aggregator_key:
                specs = [s for s in specs if s.public_key.hex() == aggregator_key]
            distinct = {s.message for s in specs}
            if len(distinct) > 1:
                raise TaskNotFound(
                    f"aggregators publish different specs for task {task_id}; pin one with --aggregator-key"
                )
            if specs:
                return specs[0]
        if time.monotonic() > deadline:
            what = f"task {task_id!r}" if task_id else "any task"
            raise TaskNotFound(f"no aggregator publishes {what} in this swarm (checked for {wait:.0f} s)")
        time.sleep(0.5)


@dataclass
class Announcer:
    """Keeps this peer's signed announcement (with its identity binding and membership certificate)
    fresh in the DHT."""

    dht: object
    speaker: Speaker
    task_id: str
    devices: tuple[DeviceInfo, ...]
    affinity: Affinity
    cohort: str
    certificate: Callable[[], bytes]  # this peer's current membership certificate (peer.membership)
    throughput: float = 0.0

    def __post_init__(self):
        self.identity, self.peer_id = self.speaker.identity, self.speaker.peer_id
        self.binding = sealed_binding(self.speaker)

    def announce(self, available: bool = True, wait: bool = True) -> bool:
        """Store a fresh announcement; ``wait=False``: return at once while the DHT stores it."""
        record = PeerAnnouncement(
            task_id=self.task_id,
            peer_id=self.peer_id,
            public_key=self.identity.public_key_hex,
            devices=self.devices,
            # 0 marks a withdrawn peer: hivemind cannot delete a record, only replace it by a newer one.
            throughput_milli=int(self.throughput * 1000) if available else 0,
            affinity=self.affinity,
            cohort_id=self.cohort,
            timestamp=int(time.time() * 1000),
        )
        value = [seal(record, self.identity), self.binding, self.certificate()]
        # bounded: hivemind's own store waits forever on a DHT whose process has ended
        return store(
            self.dht,
            peers_key(self.task_id),
            value,
            ANNOUNCE_TTL,
            subkey=self.identity.public_key_hex,
            wait=wait,
        )

    def keep_fresh(self, interval: float = ANNOUNCE_TTL / 4) -> None:
        """Re-announce every ``interval`` s from a background thread (start-up and long rounds included),
        not waiting for each store: on a loaded DHT a store that took seconds would delay the next."""
        self._stopping = threading.Event()

        def loop() -> None:
            while not self._stopping.wait(interval):
                try:
                    self.announce(wait=False)
                except Exception as e:  # a transient DHT failure; the next refresh retries
                    logger.debug(f"re-announcement failed: {e}")

        self._thread = threading.Thread(target=loop, name="manta-announcer", daemon=True)
        self._thread.start()

    def withdraw(self) -> bool:
        if getattr(self, "_stopping", None) is not None:
            self._stopping.set()
            self._thread.join(timeout=10)
        return self.announce(available=False)


class ProgressBoard:
    """Signed per-peer progress records under ``manta_T_progress`` (see :class:`PeerProgress`)."""

    def __init__(self, dht, task_id: str, speaker: Speaker):
        self.dht, self.task_id, self.speaker = dht, task_id, speaker
        self.identity, self.peer_id = speaker.identity, speaker.peer_id
        self.verified = VerifiedRecords(lambda sub, value: open_progress_value(task_id, sub, value))

    def publish(
        self,
        round_index: int,
        samples: int,
        throughput: float,
        loss: float,
        cohort: str,
        state_round: int,
        finished: tuple[int, int, float] | None = None,
        traffic: tuple[int, int] = (0, 0),
        wait: bool = True,
        data: tuple[str, int, int] = ("", 0, 0),
        averaging: bool = False,
    ) -> bool:
        """Publish this peer's progress in ``round_index``; ``finished`` is (round, samples, mean loss)
        of the last round it finished computing, repeated in every record (see :class:`PeerProgress`);
        ``traffic`` is (outer steps taken, cross-cohort bytes) since the peer started; ``data`` (shards
        held as a bitmap, shard bytes served, shard bytes fetched) in tasks on shards; ``averaging``: the
        computation of ``round_index`` is over and the peer averages it. ``wait=False``: return True at
        once while the DHT stores it (a later record expires later: it wins)."""
        done_round, done_samples, done_loss = finished if finished is not None else (0, 0, 0.0)
        record = PeerProgress(
            task_id=self.task_id,
            peer_id=self.peer_id,
            public_key=self.identity.public_key_hex,
            endorsement=self.speaker.endorsement,
            round=round_index,
            samples=int(samples),
            throughput_milli=max(0, int(throughput * 1000)),
            loss_micro=_micro(loss),
            cohort_id=cohort,
            state_round=state_round + 1,
            timestamp=int(time.time() * 1000),
            finished_round=done_round,
            finished_samples=int(done_samples),
            finished_loss_micro=_micro(done_loss),
            outer_steps=int(traffic[0]),
            cross_cohort_bytes=int(traffic[1]),
            shards_held=data[0],
            data_bytes_served=int(data[1]),
            data_bytes_fetched=int(data[2]),
            averaging=averaging,
        )
        return store(
            self.dht,
            progress_key(self.task_id),
            seal(record, self.identity),
            PROGRESS_TTL,
            subkey=self.identity.public_key_hex,
            wait=wait,
        )

    def read(self) -> list[PeerProgress]:
        """Every peer's latest verified progress record."""
        out = []
        for sub, value in _entries(self.dht, progress_key(self.task_id)).items():
            try:
                out.append(self.verified.open(sub, value).record)
            except RecordRejected:
                continue
        return out


def _micro(loss: float) -> int:
    """A loss x 10^6 as a non-negative integer; NaN (a diverged step) is reported as 0."""
    return max(0, int(loss * 1e6)) if loss == loss else 0


def swarm_samples(
    records: list[PeerProgress],
    round_index: int,
    now_ms: int,
    exclude: str = "",
    cap: Callable[[str], float] | None = None,
) -> tuple[float, int]:
    """Samples the other peers have processed in ``round_index`` by now, and how many peers they are:
    each report's count plus what its throughput adds since it was published (at most 2 s of it: a
    silent peer is not trusted further; nothing for a peer that averages: its count is final), and at most ``cap(peer id)`` per peer (a record's count is
    its peer's word: :class:`peer.swarm_progress.SwarmProgress` caps it by what the peer's committed
    rounds showed it can do)."""
    total, peers = 0.0, 0
    for r in records:
        if r.round != round_index or r.peer_id == exclude:
            continue
        elapsed = 0.0 if r.averaging else min(2.0, max(0.0, (now_ms - r.timestamp) / 1000))
        counted = r.samples + r.throughput_milli / 1000 * elapsed
        total += counted if cap is None else min(counted, cap(r.peer_id))
        peers += 1
    return total, peers
