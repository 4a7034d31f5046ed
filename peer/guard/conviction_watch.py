"""Reducers convicted of telling members different stories, found after the fact and shared.

A peer compares the reducers' signed proofs digests only among the reports it reads before it
commits (:func:`peer.commit.waits.await_commit`). A reducer that delays one member's results until
the others have committed keeps that member's report out of every comparison that could stop the
result, and a peer that saw the two stories barred the reducer from its own groups only: the others
met it again in the next attempt. So the evidence is kept looking for and passed on:

- an attempt whose contributors had not all reported when this peer decided is read again later
  (:data:`RECHECK_AFTER_SECONDS`, while the board still keeps its reports), on this thread, off the
  round's (with every report in, every story was compared already);
- two signed digests that differ are posted as a :class:`~protocol.records.ReducerConviction`,
  which every node's validator checks (both signatures under the reducer's key) before storing it;
- every peer reads the convictions every :data:`READ_EVERY_SECONDS`, and its averagers meet no peer
  of a convicted key for the rest of the run (:meth:`peer.guard.admission.AdmissionMemory.bar_key`).

A result that committed over a late victim is not undone: every member that committed it checked
its own entry, so the lie is bounded to the entries of members that had not reported (the late
victims and the reducer itself), each held to the robust average's clipping. What this adds is that
the reducer cannot do it twice: once any peer sees both stories, every peer stops meeting it within
one read, and the aggregator stops crediting it (``aggregator.contributions``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping

from hivemind_adapter.dht import read_signed
from hivemind_adapter.dht import store as dht_store
from peer.commit.boards import CommitBoard
from peer.commit.quorum import equivocation_in
from protocol.dht_schema import conviction_subkey, convictions_key, open_conviction_value
from protocol.identity import Identity
from protocol.proof_attestation import Equivocation
from protocol.record_lifetimes import CONVICTION_TTL
from protocol.records import ReducerConviction
from protocol.sealing import seal

logger = logging.getLogger(__name__)

# When an attempt's reports are read again, after this peer posted its own: a victim's report comes
# once the reducer lets its results through, at most an all-reduce's timeout after the others'; the
# signed board keeps reports for 90 s.
RECHECK_AFTER_SECONDS = (20.0, 60.0)
READ_EVERY_SECONDS = 10.0  # how often the posted convictions are read
WAKE_SECONDS = 1.0  # the watch thread's tick: rechecks come due at most this late


class ConvictionWatch:
    """Looks for reducers' equivocations in commit reports read late, posts the evidence, and reads
    the evidence others posted. One per peer, shared by its averagers (each passes its own board).

    ``public_keys`` gives the roster's keys (peer id -> hex) whose signatures count; a peer id whose
    key is unknown convicts nobody."""

    def __init__(
        self,
        dht,
        task_id: str,
        identity: Identity,
        public_keys: Callable[[], Mapping[str, str]],
        recheck_after: tuple[float, ...] = RECHECK_AFTER_SECONDS,
        read_every: float = READ_EVERY_SECONDS,
    ):
        self.dht, self.task_id, self.identity = dht, task_id, identity
        self.public_keys, self.recheck_after, self.read_every = public_keys, recheck_after, read_every
        self._lock = threading.Lock()  # guards the three collections below
        self._due: list[tuple[float, int, CommitBoard]] = []  # (when, attempt, board) to read again
        self._convicted: dict[str, str] = {}  # reducer key -> why, as first learnt
        # reducer key -> this peer's own evidence against it, and when it was last posted
        self._posted: dict[str, tuple[ReducerConviction, float]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="manta-convictions", daemon=True)
        self.rechecks = 0  # attempts read again (for tests and logs)

    def start(self) -> ConvictionWatch:
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    # ------------------------------------------------------------------ the round's side

    def recheck_later(self, board: CommitBoard, attempt: int) -> None:
        """This peer decided ``attempt`` on ``board`` before every contributor reported: read its
        reports again later."""
        now = time.monotonic()
        with self._lock:
            self._due.extend((now + after, attempt, board) for after in self.recheck_after)

    def report(self, equivocation: Equivocation) -> bool:
        """Post ``equivocation`` as evidence (not waiting for the DHT) and convict its reducer's key
        here at once; False if the reducer's key is not known (nothing posted)."""
        key = self.public_keys().get(equivocation.reducer)
        if key is None:
            return False
        record = ReducerConviction(
            task_id=self.task_id,
            public_key=self.identity.public_key_hex,
            reducer_key=key,
            first=equivocation.first.to_token(),
            second=equivocation.second.to_token(),
            timestamp=int(time.time() * 1000),
        )
        if not record.signatures_hold():  # a key rotated since: the evidence would be refused anyway
            return False
        with self._lock:
            self._posted[key] = (record, time.monotonic())
            self._convicted.setdefault(key, equivocation.describe())
        self._store(record, wait=False)
        logger.warning(f"posted the evidence: {equivocation.describe()}")
        return True

    def convicted_keys(self) -> set[str]:
        """Every key convicted so far, here or by evidence read from the DHT."""
        with self._lock:
            return set(self._convicted)

    # ------------------------------------------------------------------ the thread

    def _run(self) -> None:
        next_read = time.monotonic()
        while not self._stop.wait(WAKE_SECONDS):
            try:
                self._recheck_due()
                if time.monotonic() >= next_read:
                    next_read = time.monotonic() + self.read_every
                    self.read_posted()
                    self._refresh_own()
            except Exception as e:  # a failed DHT read proves nothing; the next tick tries again
                logger.debug(f"conviction watch: {type(e).__name__}: {e}")

    def _recheck_due(self) -> None:
        now = time.monotonic()
        with self._lock:
            due = [d for d in self._due if d[0] <= now]
            self._due = [d for d in self._due if d[0] > now]
        for _, attempt, board in sorted(due, key=lambda d: d[1]):
            self.rechecks += 1
            found = equivocation_in(board.read(attempt), self.public_keys())
            if found is not None and found.reducer not in self._convicted_peers():
                logger.warning(f"attempt {attempt}, read again: {found.describe()}")
                self.report(found)

    def _convicted_peers(self) -> set[str]:
        keys = self.public_keys()
        convicted = self.convicted_keys()
        return {peer for peer, key in keys.items() if key in convicted}

    def read_posted(self) -> set[str]:
        """Read the convictions posted for this task (each checked by the validator's rules again
        here); the keys newly convicted."""
        found = read_signed(
            self.dht,
            convictions_key(self.task_id),
            lambda sub, v: open_conviction_value(self.task_id, sub, v),
        )
        new = set()
        with self._lock:
            for sealed in found:
                record = sealed.record
                if record.reducer_key not in self._convicted:
                    self._convicted[record.reducer_key] = (
                        f"reducer {record.reducer[-8:]} convicted of sending different signed proofs "
                        f"(posted by {record.public_key[:8]})"
                    )
                    new.add(record.reducer_key)
        for key in new:
            logger.warning(f"key {key[:16]}: {self._convicted[key]}")
        return new

    def _refresh_own(self) -> None:
        """Post this peer's evidence again before it expires, signed anew (a copy lives
        ``CONVICTION_TTL`` from its signed time)."""
        now, now_ms = time.monotonic(), int(time.time() * 1000)
        with self._lock:
            stale = [
                r.model_copy(update={"timestamp": now_ms})
                for r, at in self._posted.values()
                if now - at > CONVICTION_TTL / 2
            ]
            for record in stale:
                self._posted[record.reducer_key] = (record, now)
        for record in stale:
            self._store(record, wait=False)

    def _store(self, record: ReducerConviction, wait: bool) -> None:
        dht_store(
            self.dht,
            convictions_key(self.task_id),
            seal(record, self.identity),
            CONVICTION_TTL,
            subkey=conviction_subkey(record.reducer_key, self.identity.public_key_hex),
            wait=wait,
        )
