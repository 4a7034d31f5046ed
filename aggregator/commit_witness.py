"""Which averaging groups the swarm committed, as its peers' signed commit reports say.

A receipt names its group (``group_id``: the attempt, the contributors' Merkle root and count, and
the start state). A committed round is one whose result a quorum of the roster posted on the commit
board (:class:`protocol.records.RoundCommit`), and every such report names the result's group.
So the aggregator credits a receipt only when peers *other than its sender* posted, under their own
keys, that they committed the very group it names: a group its sender invented (a self-only group,
an inflated sample count, another start state) has no other witness.

Reports are read from the DHT per attempt (one bucket, a bounded read) as receipts arrive, and read
again when a round closes; what was read is kept for the round window, since reports expire from
the DHT sooner (90 s) than a slow round closes. The reads happen off the ledger's writer thread.
A receipt that first arrives after its reports expired (this aggregator was down) comes with them:
its sender kept them (:mod:`protocol.witness_bundle`, :meth:`CommitWitness.take_bundle`).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable

from hivemind_adapter.dht import read_signed
from protocol.dht_schema import (
    commit_subkey,
    commits_key,
    convictions_key,
    open_commit_value,
    open_conviction_value,
)
from protocol.proof_attestation import Equivocation, find_equivocation, parse_tokens
from protocol.records import ReducerConviction, RoundCommit
from protocol.sealing import RecordRejected, parse_sealed
from protocol.witness_bundle import WitnessBundle

ATTEMPTS_KEPT = 512  # attempts whose reports are remembered (several per round across the window)
# How far past the newest attempt read from the board a witness bundle may be (the board is read as
# each receipt arrives, so its receipt's attempt is normally read already).
BUNDLE_AHEAD = 16


class CommitWitness:
    def __init__(self, dht, task_id: str, is_member: Callable[[str], bool] = lambda key: True):
        """``is_member(key)``: whether a report's key counts (a member of the task); others are
        ignored, so throw-away keys witness nothing."""
        self.dht, self.task_id, self.is_member = dht, task_id, is_member
        # attempt -> public key (hex) -> that key's latest report of the attempt with a group
        self._seen: OrderedDict[int, dict[str, RoundCommit]] = OrderedDict()
        self._lock = threading.Lock()  # guards _seen and _newest_read (handler threads, the closer)
        self._newest_read: int | None = None  # the newest attempt read from the DHT

    def read(self, attempts: Iterable[int]) -> None:
        """Read the reports of ``attempts`` from the DHT (one bounded read each) and remember them."""
        for attempt in sorted(set(attempts)):
            found = read_signed(
                self.dht,
                commits_key(self.task_id, attempt),
                lambda sub, value: open_commit_value(self.task_id, sub, value),
            )
            self.learn(s.record for s in found if s.record.attempt == attempt)
            with self._lock:
                self._newest_read = max(
                    attempt, self._newest_read if self._newest_read is not None else attempt
                )

    def take_bundle(self, data: bytes) -> int:
        """Learn what a receipt's sender kept of its group's reports (:class:`WitnessBundle`): each
        report signed by the key it names, of this task, of the bundle's attempt and group, from a key
        not already known for that attempt (a bundle never replaces what the board said). Only near
        the attempts read from the board (a flood of other attempts would push real ones out of the
        memory). Returns how many it learned; ValueError if ``data`` is no bundle."""
        bundle = WitnessBundle.from_bytes(data)
        if not self.near(bundle.attempt):
            return 0
        with self._lock:
            known = set(self._seen.get(bundle.attempt, {}))
        reports = {}
        for wire in bundle.reports:
            try:
                key = parse_sealed(wire, RoundCommit).record.public_key  # where the board keeps it
                record = open_commit_value(self.task_id, commit_subkey(bundle.attempt, key), wire).record
            except RecordRejected:
                continue
            if record.ok and record.group == bundle.group and record.public_key not in known:
                reports[record.public_key] = record
        self.learn(reports.values())
        return len(reports)

    def learn(self, commits: Iterable[RoundCommit]) -> None:
        """Remember signature-checked reports (a key's later report of an attempt replaces its earlier
        one only if it names a group: the state report re-posts the same group)."""
        with self._lock:
            for commit in commits:
                if not (commit.ok and commit.group) or not self.is_member(commit.public_key):
                    continue
                self._seen.setdefault(commit.attempt, {})[commit.public_key] = commit
                self._seen.move_to_end(commit.attempt)
            while len(self._seen) > ATTEMPTS_KEPT:
                self._seen.popitem(last=False)

    def witnesses(self, attempt: int, group: str) -> set[str]:
        """The keys (hex) that reported committing ``group`` in ``attempt``."""
        with self._lock:
            reports = self._seen.get(attempt, {})
            return {key for key, commit in reports.items() if commit.group == group}

    def states_after(self, attempt: int, group: str) -> dict[str, set[str]]:
        """State digest -> the peer ids that reported holding it after committing ``group`` in
        ``attempt`` (each peer's latest report: the state report re-posts the commit with it)."""
        with self._lock:
            out: dict[str, set[str]] = {}
            for commit in self._seen.get(attempt, {}).values():
                if commit.group == group and commit.state:
                    out.setdefault(commit.state, set()).add(commit.peer_id)
            return out

    def holders_of(self, attempt: int, state: str) -> set[str]:
        """The peer ids that reported holding ``state`` after committing a group of ``attempt``."""
        with self._lock:
            return {c.peer_id for c in self._seen.get(attempt, {}).values() if c.state == state}

    def newest_attempt(self) -> int:
        """The newest attempt read from the board (-1: none yet)."""
        with self._lock:
            return -1 if self._newest_read is None else self._newest_read

    def near(self, attempt: int) -> bool:
        """Whether ``attempt`` is close enough to the newest attempt read from the board to be read
        for a caller that is not a receipt (a far one would push real attempts out of the memory)."""
        with self._lock:
            newest = self._newest_read
        return newest is not None and newest - ATTEMPTS_KEPT // 2 <= attempt <= newest + BUNDLE_AHEAD

    def commit_counts(self, attempt: int) -> dict[str, int]:
        """Group id -> how many keys reported committing it in ``attempt``."""
        with self._lock:
            counts: dict[str, int] = {}
            for commit in self._seen.get(attempt, {}).values():
                counts[commit.group] = counts.get(commit.group, 0) + 1
            return counts

    def named_outlier(self, attempt: int, peer_id: str) -> set[str]:
        """The keys (hex) whose reports of ``attempt`` name ``peer_id`` an outlier (robust averaging)."""
        with self._lock:
            reports = self._seen.get(attempt, {})
            return {key for key, commit in reports.items() if peer_id in commit.outliers}

    def equivocation(self, attempt: int, peer_id: str, public_key: str) -> Equivocation | None:
        """Two different proofs messages that ``peer_id`` signed under ``public_key`` for one
        all-reduce of ``attempt``, as the members it sent them to posted them; None if none."""
        with self._lock:
            posted = [
                (commit.peer_id, [a for a in parse_tokens(commit.proofs) if a.reducer == peer_id])
                for _key, commit in sorted(self._seen.get(attempt, {}).items())
            ]
        return find_equivocation(posted, {peer_id: public_key})

    def known(self, attempt: int) -> bool:
        with self._lock:
            return attempt in self._seen

    def convictions(self) -> list[ReducerConviction]:
        """The convictions peers posted for the task (:mod:`peer.guard.conviction_watch`), each checked
        again here: two different proofs digests its reducer key signed for one all-reduce. Evidence
        found after a round's reports expired, or that the aggregator never read in time."""
        found = read_signed(
            self.dht,
            convictions_key(self.task_id),
            lambda sub, v: open_conviction_value(self.task_id, sub, v),
        )
        return [sealed.record for sealed in found]
