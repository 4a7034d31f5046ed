"""Where participants post and read their commit reports: the :class:`CommitBoard` interface, the
signed board of a MANTA task (:class:`SignedCommitBoard`) and an unsigned one for swarms whose peers
trust each other (:class:`DHTCommitBoard`: tests, benchmarks)."""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping
from dataclasses import asdict
from typing import Any, Protocol

from hivemind_adapter.dht import peer_id, read_entries, read_entries_of_keys, store
from peer.commit.report import CommitReport
from protocol.dht_schema import COMMIT_BUCKETS, commit_subkey, commits_key, open_commit_value
from protocol.peer_keys import Speaker
from protocol.record_lifetimes import COMMIT_TTL
from protocol.records import MAX_CHECKS_POSTED, MAX_PROOFS_POSTED, RoundCommit
from protocol.sealing import RecordRejected, seal
from protocol.verified_records import VerifiedRecords

NEAR_WINDOW = 4  # attempts whose buckets latest_attempt(near=...) reads first, from near on


class ReportSource(Protocol):
    """Where a round's stages learn which peers ended an attempt: a board, or the votes heard."""

    peer_id: str

    def read(self, attempt: int) -> dict[str, CommitReport]:
        """peer id -> its report of ``attempt``, for every peer known here to have ended it."""
        ...


class CommitBoard(Protocol):
    """Where participants post and read their end-of-attempt reports."""

    peer_id: str  # whose reports :meth:`post` writes
    ttl: float  # how long what it posts lives (a peer sets it from its rounds: record_lifetimes.commit_ttl)

    def post(self, attempt: int, report: CommitReport, wait: bool = True) -> None:
        """Post ``report`` as this peer's latest record of ``attempt``. ``wait=False``: return while the
        DHT still stores it (a later record of the same attempt replaces an earlier one whichever
        lands first: it expires later)."""
        ...

    def read(self, attempt: int) -> dict[str, CommitReport]:
        """peer id -> its report of ``attempt``, for every peer that ended it (markers are skipped)."""
        ...

    def read_checks(self, attempt: int) -> dict[str, CommitReport]:
        """peer id -> its latest record of ``attempt``, marker or report."""
        ...

    def latest_attempt(self, peers: Collection[str] | None = None, near: int | None = None) -> int:
        """The highest attempt anyone (of ``peers``, if given) ended recently, departure notices and
        markers aside (-1 if none): where the swarm (or those peers) last ended an attempt. A marker
        is posted mid-attempt: counting it would end a newcomer's sit-out before the commit.
        ``near``: an attempt the caller ended lately, where the answer most likely is (a hint that
        may save reads, never changes the answer)."""
        ...


def _to_wire(report: CommitReport) -> dict[str, Any]:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(report).items()}


def _from_wire(value: Mapping[str, Any]) -> CommitReport:
    def strings(key: str) -> tuple[str, ...]:
        return tuple(map(str, value.get(key) or ()))

    return CommitReport(
        ok=bool(value.get("ok")), digest=str(value.get("digest", "")), left=bool(value.get("left")),
        state=str(value.get("state", "")), group=str(value.get("group", "")), outliers=strings("outliers"),
        proofs=strings("proofs"), checked=strings("checked"), checking=bool(value.get("checking")),
        refused=strings("refused"),
    )  # fmt: skip


class DHTCommitBoard:
    """An unsigned board under ``{run_id}_commits`` (subkey ``<attempt>/<peer id>``), for swarms whose
    peers trust each other (tests, benchmarks)."""

    def __init__(self, dht, run_id: str, ttl: float = 60.0):
        self.dht, self.key, self.ttl = dht, f"{run_id}_commits", ttl
        self.peer_id = peer_id(dht)

    def post(self, attempt: int, report: CommitReport, wait: bool = True) -> None:
        store(self.dht, self.key, _to_wire(report), self.ttl, subkey=f"{attempt}/{self.peer_id}", wait=wait)

    def _entries(self) -> dict[tuple[int, str], CommitReport]:
        out = {}
        for sub, value in read_entries(self.dht, self.key).items():
            attempt, _, peer = sub.partition("/")
            if attempt.isdigit() and isinstance(value, dict):
                out[int(attempt), peer] = _from_wire(value)
        return out

    def read(self, attempt: int) -> dict[str, CommitReport]:
        return {peer: r for (a, peer), r in self._entries().items() if a == attempt and not r.checking}

    def read_checks(self, attempt: int) -> dict[str, CommitReport]:
        return {peer: r for (a, peer), r in self._entries().items() if a == attempt}

    def latest_attempt(self, peers: Collection[str] | None = None, near: int | None = None) -> int:
        return max(
            (
                a
                for (a, p), r in self._entries().items()
                if not (r.left or r.checking) and (peers is None or p in peers)
            ),
            default=-1,
        )


class SignedCommitBoard:
    """The commit board of a MANTA task: sealed RoundCommit records under ``manta_T_commits_B``, which
    every node's validator checks, so no peer can abort other peers' rounds or fake agreement in
    someone else's name.

    Reports are spread over :data:`~protocol.dht_schema.COMMIT_BUCKETS` keys by attempt: a read of
    one attempt fetches one bucket; :meth:`latest_attempt` reads the buckets of the
    :data:`NEAR_WINDOW` attempts from ``near`` on, and every bucket only where those cannot tell."""

    def __init__(self, dht, task_id: str, speaker: Speaker, ttl: float = COMMIT_TTL):
        self.dht, self.task_id, self.speaker, self.ttl = dht, task_id, speaker, ttl
        self.identity, self.peer_id = speaker.identity, speaker.peer_id
        self.verified = VerifiedRecords(lambda sub, value: open_commit_value(task_id, sub, value))

    def post(self, attempt: int, report: CommitReport, wait: bool = True) -> None:
        record = RoundCommit(
            task_id=self.task_id,
            attempt=attempt,
            peer_id=self.peer_id,
            public_key=self.identity.public_key_hex,
            endorsement=self.speaker.endorsement,
            ok=report.ok,
            digest=report.digest,
            timestamp=int(time.time() * 1000),
            left=report.left,
            state=report.state,
            group=report.group,
            outliers=report.outliers[:32],
            proofs=report.proofs[:MAX_PROOFS_POSTED],
            checked=report.checked[-MAX_CHECKS_POSTED:],
            checking=report.checking,
            refused=report.refused[-MAX_CHECKS_POSTED:],
        )
        store(
            self.dht,
            commits_key(self.task_id, attempt),
            seal(record, self.identity),
            self.ttl,
            subkey=commit_subkey(attempt, self.identity.public_key_hex),
            wait=wait,
        )

    def _open(self, entries: dict[str, Any], attempt: int | None = None) -> list[RoundCommit]:
        """Verified records among ``entries`` (of ``attempt`` only, if given: the subkey names it, so
        other attempts sharing its bucket are skipped before any check; a subkey that lies about its
        attempt fails the check)."""
        prefix = None if attempt is None else f"{attempt}/"
        out = []
        for sub, value in entries.items():
            if prefix is not None and not str(sub).startswith(prefix):
                continue
            try:
                out.append(self.verified.open(sub, value).record)
            except RecordRejected:
                continue
        return out

    def read_checks(self, attempt: int) -> dict[str, CommitReport]:
        entries = read_entries(self.dht, commits_key(self.task_id, attempt))
        return {r.peer_id: _from_record(r) for r in self._open(entries, attempt)}

    def read(self, attempt: int) -> dict[str, CommitReport]:
        return {peer: r for peer, r in self.read_checks(attempt).items() if not r.checking}

    def latest_attempt(self, peers: Collection[str] | None = None, near: int | None = None) -> int:
        # Attempts follow each other (each is one past the latest ended) and their records expire in
        # the order they were posted: if the window holds an attempt from ``near`` on but not its last,
        # no later attempt was ended. Otherwise (the swarm may be further on) every bucket is read.
        if near is not None and near >= 0:
            window = range(near, near + NEAR_WINDOW)
            latest = self._latest_in([commits_key(self.task_id, a) for a in window], peers)
            if near <= latest < window[-1]:
                return latest
        return self._latest_in([commits_key(self.task_id, b) for b in range(COMMIT_BUCKETS)], peers)

    def _latest_in(self, keys: list[str], peers: Collection[str] | None) -> int:
        return max(
            (
                r.attempt
                for e in read_entries_of_keys(self.dht, keys)
                for r in self._open(e)
                if not (r.left or r.checking) and (peers is None or r.peer_id in peers)
            ),
            default=-1,
        )


def _from_record(r: RoundCommit) -> CommitReport:
    return CommitReport(
        ok=r.ok, digest=r.digest, left=r.left, state=r.state, group=r.group, outliers=tuple(r.outliers),
        proofs=tuple(r.proofs), checked=tuple(r.checked), checking=r.checking, refused=tuple(r.refused),
    )  # fmt: skip
