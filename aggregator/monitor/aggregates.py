"""Per-round and per-peer aggregates of what the swarm reports, built from successive DHT readings.

A peer overwrites its progress record about once a second while it computes round ``r`` and once more
when it stops, so each reading shows at most one record per peer: its latest. Keeping, per round, the
latest record of every peer that reported for it gives the round's figures once the round is over:

* ``samples``: the sum of the peers' sample counts (what the swarm processed toward the target);
* ``loss``: the sample-weighted mean of the peers' mean training losses;
* ``throughput``: the sum of the peers' samples per second, ``peers`` and ``cohorts``.

The last record a peer publishes for a round may be overwritten (by its first report of the next
round) before a reading catches it; every record therefore repeats the final samples and loss of the
last round the peer finished (``finished_*``), and those replace the in-round reports of that round.
A round's figures are exact once each of its peers has published one later record (or its last one).

"Online" and "last seen" use this machine's clock (when a newer record from the peer was first seen),
not the peers' timestamps, so a peer with a wrong clock cannot appear fresher than it is.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from aggregator.monitor.swarm_reader import SwarmReading
from protocol.identity import fingerprint
from protocol.records import DeviceInfo, PeerAnnouncement, PeerProgress
from protocol.shards import held_shards

FORGET_AFTER = 600.0  # seconds: a peer offline this long leaves the peers table
MAX_ROUNDS = 10_000  # rounds kept in memory (the oldest go first)


def describe_devices(devices: tuple[DeviceInfo, ...]) -> str:
    """``"cpu: Xeon"`` or ``"cuda: H100 x2, cpu: EPYC"``: one phrase for the peers table."""
    counts = Counter((d.kind, d.name) for d in devices)
    return ", ".join(f"{kind}: {name}" + (f" x{n}" if n > 1 else "") for (kind, name), n in counts.items())


@dataclass
class _Peer:
    peer_id: str
    public_key: str
    first_seen: float
    last_seen: float
    announcement: PeerAnnouncement | None = None
    announced: bool = False  # present, not withdrawn, in the latest reading
    progress: PeerProgress | None = None
    progress_seen: float = 0.0  # local time its latest progress record was first seen
    progress_present: bool = False


@dataclass
class _Round:
    reports: dict[str, PeerProgress] = field(default_factory=dict)  # peer id -> latest record
    # peer id -> (samples, loss x 1e6, None where unknown)
    final: dict[str, tuple[int, int | None]] = field(default_factory=dict)
    credited: bool = False  # ``final`` holds what the ledger credited: exactly the round's contributors
    first_seen: float = 0.0
    last_change: float = 0.0


class SwarmAggregates:
    """The monitor's memory of the swarm. Thread-safe: the collector writes, HTTP handlers read."""

    def __init__(self, *, max_rounds: int = MAX_ROUNDS, forget_after: float = FORGET_AFTER):
        self.max_rounds, self.forget_after = max_rounds, forget_after
        self._lock = threading.Lock()
        self._peers: dict[str, _Peer] = {}
        self._rounds: dict[int, _Round] = {}
        self._validation: dict[int, dict[str, Any]] = {}
        self._present_rounds: set[int] = set()
        self._last_round: int | None = None
        self.readings = 0
        self.rejected = 0  # records that failed verification, over all readings
        self.last_reading: float | None = None
        self._departed_bytes = 0  # cross-cohort bytes of peers forgotten since (so totals never shrink)
        self._history: dict[int, dict[str, Any]] = {}  # rows of rounds seen before a restart (rounds.jsonl)
        # Set where a contribution desk credits rounds (:meth:`credit`): a round is final once credited.
        self.crediting = False

    # ------------------------------------------------------------------ writing

    def observe(self, reading: SwarmReading, now: float) -> None:
        """Fold one DHT reading (taken at local time ``now``, seconds) into the aggregates."""
        with self._lock:
            self.readings += 1
            self.rejected += reading.rejected
            self.last_reading = now
            for peer in self._peers.values():
                peer.announced = peer.progress_present = False
            for a in reading.announcements:
                peer = self._peer(a.peer_id, a.public_key, now)
                if peer.announcement is None or a.timestamp > peer.announcement.timestamp:
                    peer.announcement, peer.last_seen = a, now
                peer.announced = peer.announcement.throughput_milli > 0  # 0 marks a withdrawn peer
            self._present_rounds = set()
            for p in reading.progress:
                peer = self._peer(p.peer_id, p.public_key, now)
                peer.progress_present = True
                self._present_rounds.add(p.round)
                if peer.progress is None or p.timestamp > peer.progress.timestamp:
                    peer.progress, peer.progress_seen, peer.last_seen = p, now, now
                self._report(p, now)
            self._forget(now)

    def _peer(self, peer_id: str, public_key: str, now: float) -> _Peer:
        peer = self._peers.get(peer_id)
        if peer is None or peer.public_key != public_key:  # a peer id re-bound to another key starts afresh
            peer = self._peers[peer_id] = _Peer(peer_id, public_key, now, now)
        return peer

    def _round(self, index: int, now: float) -> _Round | None:
        entry = self._rounds.get(index)
        if entry is None:
            if len(self._rounds) >= self.max_rounds and index < min(self._rounds):
                return None  # older than everything kept
            entry = self._rounds[index] = _Round(first_seen=now)
            while len(self._rounds) > self.max_rounds:
                del self._rounds[min(self._rounds)]
        return entry

    def _report(self, p: PeerProgress, now: float) -> None:
        if p.finished_samples > 0:
            done = self._round(p.finished_round, now)
            final = (p.finished_samples, p.finished_loss_micro)
            if done is not None and done.credited:
                if p.peer_id in done.final:  # the ledger's samples stand; the loss is the peer's word
                    done.final[p.peer_id] = (done.final[p.peer_id][0], p.finished_loss_micro)
            elif done is not None and done.final.get(p.peer_id) != final:
                done.final[p.peer_id] = final
                done.last_change = now
        entry = self._round(p.round, now)
        if entry is None:
            return
        old = entry.reports.get(p.peer_id)
        if old is None or p.timestamp > old.timestamp:
            entry.reports[p.peer_id] = p
            entry.last_change = now
        self._last_round = max(p.round, self._last_round if self._last_round is not None else p.round)

    def credit(self, round_index: int, samples: dict[str, int], now: float) -> None:
        """Peer id -> the samples the ledger credited it for ``round_index`` (its accepted receipts):
        the round's figures from now on, whatever the progress records said or a reading missed
        (the loss stays the peer's reported one)."""
        with self._lock:
            entry = self._round(round_index, now)
            if entry is None:
                return
            losses = {p: r.loss_micro for p, r in entry.reports.items() if r.samples > 0}
            losses.update({p: loss for p, (_, loss) in entry.final.items()})
            credited = {p: n for p, (n, _) in entry.final.items()} if entry.credited else {}
            for peer, n in samples.items():  # a receipt that came after its round closed adds to it
                credited[peer] = credited.get(peer, 0) + n
            entry.final = {peer: (n, losses.get(peer)) for peer, n in credited.items()}
            entry.credited, entry.last_change = True, now

    def _forget(self, now: float) -> None:
        for peer_id in [k for k, p in self._peers.items() if now - p.last_seen > self.forget_after]:
            if not (self._peers[peer_id].announced or self._peers[peer_id].progress_present):
                gone = self._peers.pop(peer_id)
                self._departed_bytes += gone.progress.cross_cohort_bytes if gone.progress else 0

    def record_validation(self, round_index: int, result: dict[str, Any]) -> None:
        """The validation metrics of the checkpoint after ``round_index`` (see :mod:`.evaluation`)."""
        with self._lock:
            self._validation[round_index] = dict(result)
            while len(self._validation) > self.max_rounds:
                del self._validation[min(self._validation)]

    def restore(self, rows: list[dict[str, Any]]) -> None:
        """Rows of rounds an earlier run of the aggregator saw (:meth:`rounds`' shape, without
        ``validation``): shown for those rounds until a reading reports them again."""
        with self._lock:
            for row in rows:
                self._history[int(row["round"])] = dict(row)
            while len(self._history) > self.max_rounds:
                del self._history[min(self._history)]

    # ------------------------------------------------------------------ reading

    def rounds(self, since: int = 0) -> list[dict[str, Any]]:
        """One row per round (oldest first) with a report or a validation result, from ``since`` on."""
        with self._lock:
            known = set(self._rounds) | set(self._validation) | set(self._history)
            return [self._round_row(i) for i in sorted(i for i in known if i >= since)]

    def finished_rounds(self, now: float, quiet_seconds: float) -> list[dict[str, Any]]:
        """The rows (:meth:`rounds`' shape) of the rounds with samples whose figures no longer change:
        where a desk credits rounds (:attr:`crediting`), those it credited; else, as far as the
        progress records tell, two or more rounds behind the newest reported, or unchanged for
        ``quiet_seconds`` while no present record is about them."""
        with self._lock:
            newest = self._last_round
            done = [
                i
                for i, entry in self._rounds.items()
                if entry.credited
                or not self.crediting
                and (
                    (newest is not None and i <= newest - 2)
                    or (i not in self._present_rounds and now - entry.last_change >= quiet_seconds)
                )
            ]
            rows = [self._round_row(i) for i in sorted(done)]
        return [row for row in rows if row["samples"] > 0]

    def validations(self) -> dict[int, dict[str, Any]]:
        """Checkpoint round -> its validation result (:meth:`record_validation`), a copy."""
        with self._lock:
            return {i: dict(v) for i, v in self._validation.items()}

    def _round_row(self, index: int) -> dict[str, Any]:
        entry = self._rounds.get(index)
        if entry is None and index in self._history:
            return {**self._history[index], "validation": self._validation.get(index)}
        reports = list(entry.reports.values()) if entry else []
        # Per peer: its final figures for the round when known, else its latest in-round report; once
        # credited, the ledger's contributors alone.
        figures = (
            {}
            if entry is not None and entry.credited
            else {r.peer_id: (r.samples, r.loss_micro) for r in reports}
        )
        figures.update(entry.final if entry else {})
        samples = sum(n for n, _ in figures.values())
        with_loss = [(n, loss) for n, loss in figures.values() if loss is not None]
        weighted = sum(loss / 1e6 * n for n, loss in with_loss)
        loss_samples = sum(n for n, _ in with_loss)
        return {
            "round": index,
            "samples": samples,
            "loss": weighted / loss_samples if loss_samples else None,
            "peers": len(figures),
            "throughput": sum(r.throughput_milli for r in reports) / 1000,
            "cohorts": sorted({r.cohort_id for r in reports}),
            "first_seen": entry.first_seen if entry else None,
            "last_change": entry.last_change if entry else None,
            "validation": self._validation.get(index),
        }

    def current_round(self) -> int | None:
        """The newest round any present progress record is about; else the newest round ever seen."""
        with self._lock:
            return max(self._present_rounds) if self._present_rounds else self._last_round

    def latest_validation(self) -> dict[str, Any] | None:
        with self._lock:
            if not self._validation:
                return None
            index = max(self._validation)
            return {"round": index, **self._validation[index]}

    def peers(self, now: float, fresh_seconds: float = 5.0) -> list[dict[str, Any]]:
        """The peers table, online peers first (then by peer id)."""
        with self._lock:
            rows = [self._peer_row(p, now, fresh_seconds) for p in self._peers.values()]
        return sorted(rows, key=lambda r: (not r["online"], r["peer_id"]))

    def _peer_row(self, peer: _Peer, now: float, fresh_seconds: float) -> dict[str, Any]:
        a, p = peer.announcement, peer.progress
        reporting = p is not None and peer.progress_present and now - peer.progress_seen <= fresh_seconds
        averaging = reporting and p.averaging  # its computation of the round is over
        computing = reporting and not averaging
        online = peer.announced or reporting
        if p is not None and peer.progress_present:
            throughput = p.throughput_milli / 1000
        else:
            throughput = a.throughput_milli / 1000 if a is not None else 0.0
        return {
            "peer_id": peer.peer_id,
            "public_key": peer.public_key,
            "fingerprint": fingerprint(bytes.fromhex(peer.public_key)),
            "cohort": p.cohort_id if p is not None else (a.cohort_id if a is not None else None),
            "device": describe_devices(a.devices) if a is not None else "",
            "devices": [d.model_dump(mode="json") for d in a.devices] if a is not None else [],
            "throughput": throughput if online else 0.0,
            "round": p.round if p is not None else None,
            "samples": p.samples if p is not None else None,
            "loss": p.loss_micro / 1e6 if p is not None and p.samples else None,
            "computing": computing,
            "averaging": averaging,
            "online": online,
            "first_seen": peer.first_seen,
            "last_seen": peer.last_seen,
            "seconds_since_seen": max(0.0, now - peer.last_seen),
        }

    def traffic(self) -> dict[str, int]:
        """Outer steps the swarm took (the most any peer reports) and the payload bytes all peers'
        all-reduces moved across cohorts (the wide-area traffic), as the peers' records say."""
        with self._lock:
            records = [p.progress for p in self._peers.values() if p.progress is not None]
            return {
                "outer_steps": max((r.outer_steps for r in records), default=0),
                "cross_cohort_bytes": self._departed_bytes + sum(r.cross_cohort_bytes for r in records),
            }

    def data(self, shards: int, aggregator_bytes_served: int) -> dict[str, Any]:
        """A task on shards: how many peers hold each shard (the aggregator holds all), the shard
        bytes peers served each other and fetched, and what the aggregator served, from the peers'
        progress records (their last word, for peers that left)."""
        with self._lock:
            records = [p.progress for p in self._peers.values() if p.progress is not None]
        holders = [0] * shards
        peers = []
        for r in records:
            held = {i for i in held_shards(r.shards_held) if i < shards} if r.shards_held else set()
            for i in held:
                holders[i] += 1
            peers.append(
                {
                    "peer_id": r.peer_id,
                    "shards": len(held),
                    "served": r.data_bytes_served,
                    "fetched": r.data_bytes_fetched,
                }
            )
        return {
            "shards": shards,
            "holders": holders,  # peers holding each shard, by manifest index
            "held_by_peers": sum(1 for h in holders if h),
            "peer_bytes_served": sum(p["served"] for p in peers),
            "peer_bytes_fetched": sum(p["fetched"] for p in peers),
            "aggregator_bytes_served": aggregator_bytes_served,
            "peers": sorted(peers, key=lambda p: p["peer_id"]),
        }

    def activity(self, now: float, fresh_seconds: float = 5.0) -> str:
        """``training`` (progress reports are arriving for the current round), ``between rounds``
        (peers are online but not reporting: averaging, committing) or ``idle`` (nobody online)."""
        rows = self.peers(now, fresh_seconds)
        if any(r["computing"] for r in rows):
            return "training"
        return "between rounds" if any(r["online"] for r in rows) else "idle"
