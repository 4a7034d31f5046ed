"""The aggregator's contribution desk: receipts in, ledger entries, checkpoints, proofs and audits out.

- **Intake.** Peers call ``manta/<task>/submit`` with a sealed receipt. Signature, binding (the
  sender's transport peer id must be the peer the receipt names, bound to its key by the binding in
  its announcement), task and timestamp are checked at once by :class:`ContributionIntake`'s rules
  and a refusal is answered with its reason; otherwise the receipt waits for its round to close.
- **Round close.** A round closes when peers report working two rounds later, or ``close_after``
  seconds after its first receipt. Its receipts then pass the swarm checks
  (:mod:`aggregator.contribution_checks`) and the intake appends the survivors in its deterministic
  order with a signed checkpoint, in one transaction; the checkpoint note is published in the DHT
  under ``manta_<task>_ledger``.
- **Proofs.** ``manta/<task>/status`` (a leaf hash) answers queued / accepted with index, inclusion
  proof and the latest checkpoint note / rejected with the reason; ``manta/<task>/credits`` (a public
  key) answers every entry of that key with proofs, revocations and the key's credit.
- **Audits.** A fraction of accepted receipts, chosen by an HMAC of the receipt under the
  aggregator's key (unpredictable to peers, reproducible for the operator), is replayed from the
  round's start state (:mod:`aggregator.audits`); a failure appends a revocation (credit withheld).
  Start states are fetched by digest from the peers that held them (:mod:`aggregator.checkpoints`).

Concurrency: the ledger has a single writer (:mod:`aggregator.ledger_writer`). The libp2p handlers
(run in threads off the event loop), the round-closing thread and the audits hand it their work and
wait for the result; no DHT call is ever made on the writer (reads come first, publications after).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import queue
import threading
import time
from collections import Counter
from pathlib import Path

from aggregator.audits import audit_receipt
from aggregator.contribution_checks import SwarmFacts, check_round
from aggregator.intake import ContributionIntake, Submission
from aggregator.ledger_writer import LedgerWriter
from hivemind_adapter.dht import peer_id, read_signed, store
from hivemind_adapter.p2p import Endpoint
from ledger.rewards import compute_rewards
from ledger.store import LedgerStore
from protocol.dht_schema import (
    aggregators_key,
    credits_handler,
    ledger_key,
    open_peer_value,
    open_progress_value,
    peers_key,
    progress_key,
    status_handler,
    submit_handler,
)
from protocol.identity import Identity
from protocol.merkle import leaf_hash
from protocol.records import (
    ContributionReceipt,
    IdentityBinding,
    RejectReason,
    Revocation,
    Sealed,
    TaskSpec,
    parse_sealed,
    seal,
)

logger = logging.getLogger(__name__)


RECEIPT_TIMES_KEPT = 64  # per peer: enough to find a receipt's predecessor within the round window


class ContributionDesk:
    def __init__(
        self,
        dht,
        endpoint: Endpoint,
        identity: Identity,
        spec: TaskSpec,
        ledger_path: Path,
        *,
        workload=None,
        states=None,
        audit_fraction: float = 0.1,
        close_after: float = 20.0,
        round_window: int = 20,
    ):
        self.dht, self.identity, self.spec = dht, identity, spec
        self.task_id = spec.task_id
        # The ledger, the intake and the tables below belong to the writer thread: every method that
        # touches them runs as a job there (self._ledger.run), never under a lock of its own.
        self._ledger = LedgerWriter(
            lambda: LedgerStore.open(
                ledger_path, create=True, origin=spec.ledger_origin, log_public_key=identity.public_key
            )
        )
        self.store = self._ledger.store
        self.intake = ContributionIntake(
            self.store, identity, self.task_id, max_age_ms=spec.params.receipt_window_ms, require_binding=True
        )
        self.workload, self.states = workload, states
        self.audit_fraction, self.close_after, self.round_window = audit_fraction, close_after, round_window
        self.counters: Counter[str] = Counter()  # accepted, each rejection reason, audits (the writer's)
        self._throughput: dict[str, float] = {}  # peer id -> announced samples/s
        # Ed25519 signatures are deterministic: a secret only this aggregator can derive, so peers
        # cannot predict which receipts will be audited.
        self._audit_key = identity.sign(f"manta-audit-selection/{spec.task_id}".encode())
        self._queued: dict[int, list[Submission]] = {}
        self._first_seen: dict[int, float] = {}
        self._arrival: dict[int, list[float]] = {}
        # Per peer, the timestamps (ms, its clock) of its recent receipts that passed the intake's
        # screening: the time between two of them bounds how long it computed (SwarmFacts.peer_seconds).
        self._receipt_times: dict[str, list[int]] = {}
        self._started_ms = int(time.time() * 1000)
        self._status: dict[bytes, dict] = {}  # leaf hash -> {"status": ..., ...}
        self._audits: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self.endpoint = endpoint
        self._register_handlers()
        self._publish_binding()
        self._threads = [
            threading.Thread(target=self._close_loop, name="manta-round-close", daemon=True),
            threading.Thread(target=self._audit_loop, name="manta-audits", daemon=True),
        ]
        for t in self._threads:
            t.start()

    # ------------------------------------------------------------------ network

    def _register_handlers(self) -> None:
        def wrap(fn):
            async def handle(payload: bytes, sender: str) -> bytes:
                # The handlers take the desk lock and touch SQLite: run them off the event loop, so
                # one slow append never stalls every other call this endpoint answers.
                try:
                    reply = await asyncio.to_thread(fn, payload, sender)
                except Exception as e:  # a bad request must never take the handler down
                    reply = {"status": "error", "detail": f"{type(e).__name__}: {e}"}
                return json.dumps(reply).encode()

            return handle

        for name, fn in (
            (submit_handler(self.task_id), self.submit),
            (status_handler(self.task_id), self.status),
            (credits_handler(self.task_id), self.credits),
        ):
            self.endpoint.serve(name, wrap(fn))

    def _publish_binding(self) -> None:
        binding = IdentityBinding(
            peer_id=peer_id(self.dht),
            public_key=self.identity.public_key_hex,
            timestamp=int(time.time() * 1000),
        )
        store(
            self.dht,
            aggregators_key(self.task_id),
            seal(binding, self.identity),
            ttl=3600,
            subkey=self.identity.public_key_hex,
        )

    def _publish_checkpoint(self, note: str) -> None:
        store(
            self.dht, ledger_key(self.task_id), note.encode(), ttl=3600, subkey=self.identity.public_key_hex
        )

    # ------------------------------------------------------------------ handlers

    def submit(self, wire: bytes, sender: str) -> dict:
        leaf = leaf_hash(wire)
        settled = self._ledger.run(lambda _: self._settled(leaf))
        if settled is not None:
            return settled
        bindings = self._read_bindings()  # a DHT read: before the work is handed to the writer
        return self._ledger.run(lambda _: self._queue(leaf, wire, sender, bindings))

    def _queue(self, leaf: bytes, wire: bytes, sender: str, bindings: list) -> dict:
        settled = self._settled(leaf)  # the same bytes may have arrived meanwhile
        if settled is not None:
            return settled
        self._learn(bindings)
        # The intake's own checks on this receipt alone (nothing is written by screen()).
        screening = self.intake.screen([Submission(wire, sender)])
        if screening.rejected:
            rejection = screening.rejected[0]
            return self._reject(leaf, rejection.reason, rejection.detail)
        receipt = screening.accepted[0].record
        self._queued.setdefault(receipt.round, []).append(Submission(wire, sender))
        self._first_seen.setdefault(receipt.round, time.monotonic())
        self._arrival.setdefault(receipt.round, []).append(receipt.timestamp / 1000)
        times = self._receipt_times.setdefault(receipt.peer_id, [])
        times.append(receipt.timestamp)
        del times[:-RECEIPT_TIMES_KEPT]
        self._status[leaf] = {"status": "queued", "round": receipt.round}
        if self.states is not None:  # where the round's start state can be fetched for an audit
            self.states.learn(receipt.round - 1, receipt.state_digest, [sender, *receipt.group_members])
        return self._status[leaf]

    def _settled(self, leaf: bytes) -> dict | None:
        """The answer for a receipt seen before (refused, or a replay of a ledger entry); else None."""
        known = self._status.get(leaf)
        if known is not None and known["status"] != "accepted":
            return known
        if known is not None or self.store.index_of(leaf) is not None:
            # Exactly these bytes are already in the ledger: submitting them again is a replay.
            self.counters[RejectReason.REPLAY.value] += 1
            logger.info(f"receipt refused: replay of ledger entry {self.store.index_of(leaf)}")
            return {
                "status": "rejected",
                "reason": RejectReason.REPLAY.value,
                "detail": "already in the ledger",
            }
        return None

    def status(self, payload: bytes, sender: str) -> dict:
        leaf = bytes.fromhex(payload.decode())
        return self._ledger.run(lambda _: self._status_of(leaf))

    def _status_of(self, leaf: bytes) -> dict:
        known = self._status.get(leaf)
        if known is None:
            index = self.store.index_of(leaf)
            if index is None:
                return {"status": "unknown"}
            known = {"status": "accepted", "index": index}
        if known["status"] != "accepted":
            return known
        return {**known, **self._proof(known["index"])}

    def credits(self, payload: bytes, sender: str) -> dict:
        key = payload.decode()
        rows, rewards = self._ledger.run(lambda _: self._entries_of(key))
        mine = next((p for p in rewards.peers if p.public_key == key), None)
        return {
            "entries": rows,
            "credits": mine.credits if mine else 0,
            "share": mine.share if mine else 0.0,
            "total_credits": rewards.total_credits,
        }

    def _entries_of(self, key: str) -> tuple[list[dict], object]:
        entries, revoked = [], set()
        for index, data in self.store.entries():
            sealed = parse_sealed(data, (ContributionReceipt, Revocation))
            if isinstance(sealed.record, Revocation):
                revoked.add(sealed.record.entry_index)
            elif sealed.public_key.hex() == key:
                entries.append((index, sealed.record, leaf_hash(data)))
        rows = [
            {
                "index": index,
                "round": r.round,
                "seq": r.seq,
                "samples": r.samples,
                "credit": r.credit,
                "revoked": index in revoked,
                "leaf_hash": leaf.hex(),
                **self._proof(index),
            }
            for index, r, leaf in entries
        ]
        return rows, compute_rewards((d for _, d in self.store.entries()), self.identity.public_key)

    def _proof(self, index: int) -> dict:
        head = self.store.latest_checkpoint()
        proof = self.store.inclusion_proof(index, head.size)
        return {"index": index, "proof": [h.hex() for h in proof], "checkpoint": head.note}

    def _reject(self, leaf: bytes, reason: RejectReason, detail: str) -> dict:
        self.counters[reason.value] += 1
        self._status[leaf] = {"status": "rejected", "reason": reason.value, "detail": detail}
        logger.info(f"receipt refused: {reason.value}: {detail}")
        return self._status[leaf]

    # ------------------------------------------------------------------ rounds

    def _read_bindings(self) -> list:
        """Peers' signed announcements with their identity bindings (a bounded DHT read)."""
        return read_signed(
            self.dht, peers_key(self.task_id), lambda sub, value: open_peer_value(self.task_id, sub, value)
        )

    def _learn(self, announcements: list) -> None:
        """Take in what :meth:`_read_bindings` found (under the lock)."""
        for announcement, binding in announcements:
            self.intake.bindings[binding.record.peer_id] = binding
            if announcement.record.throughput_milli > 0:
                self._throughput[announcement.record.peer_id] = announcement.record.throughput_milli / 1000

    def _swarm_round(self) -> int:
        records = read_signed(
            self.dht,
            progress_key(self.task_id),
            lambda sub, value: open_progress_value(self.task_id, sub, value),
        )
        return max((r.record.round for r in records), default=-1)

    def _close_loop(self) -> None:
        while not self._stop.wait(1.0):
            try:
                self.close_due_rounds()
            except Exception as e:
                logger.warning(f"closing rounds failed: {type(e).__name__}: {e}")

    def close_due_rounds(self, force: bool = False) -> None:
        if not self._ledger.run(lambda _: bool(self._queued)):
            return
        # DHT reads (each bounded) before the work goes to the writer: handlers must not wait behind them.
        swarm_round, bindings = self._swarm_round(), self._read_bindings()
        notes = self._ledger.run(lambda _: self._close_due(swarm_round, bindings, force))
        if notes:
            self._publish_checkpoint(notes[-1])

    def _close_due(self, swarm_round: int, bindings: list, force: bool) -> list[str]:
        self._learn(bindings)
        due = [
            r
            for r in sorted(self._queued)
            if force or swarm_round >= r + 2 or time.monotonic() - self._first_seen[r] > self.close_after
        ]
        return [self._close(r, max(swarm_round, r)) for r in due]

    def _close(self, round_index: int, swarm_round: int) -> str:
        """Check and append one round's receipts; returns the new checkpoint note (to publish)."""
        subs = self._queued.pop(round_index)
        self._first_seen.pop(round_index, None)
        times = self._arrival.pop(round_index, [])
        sealed = [parse_sealed(s.wire, ContributionReceipt) for s in subs]
        durations = {round_index: max(1.0, max(times) - min(times) + self._round_seconds_hint(round_index))}
        facts = SwarmFacts(
            swarm_round,
            self.round_window,
            dict(self._throughput),
            durations,
            self.spec.params.batch_size,
            {(s.record.peer_id, round_index): self._compute_window(s.record) for s in sealed},
        )
        refused = check_round(sealed, facts)
        for s in sealed:
            if s.wire in refused:
                self._reject(leaf_hash(s.wire), *refused[s.wire])
        result = self.intake.admit([sub for sub in subs if sub.wire not in refused])
        for rejection in result.rejected:
            wire = [sub for sub in subs if sub.wire not in refused][rejection.position].wire
            self._reject(leaf_hash(wire), rejection.reason, rejection.detail)
        for accepted in result.accepted:
            leaf = leaf_hash(accepted.wire)
            self._status[leaf] = {"status": "accepted", "index": self.store.index_of(leaf)}
            self.counters["accepted"] += 1
            if self._selected_for_audit(accepted.wire):
                self._audits.put(accepted)
        logger.info(
            f"round {round_index}: {len(result.accepted)} receipt(s) appended, {len(subs) - len(result.accepted)} "
            f"refused; ledger size {result.checkpoint.size}"
        )
        return result.checkpoint.note

    def _compute_window(self, receipt: ContributionReceipt) -> float:
        """Seconds between this peer's previous receipt (or, for its first, this desk's start) and
        ``receipt``: the time it can have spent computing that round."""
        earlier = [t for t in self._receipt_times.get(receipt.peer_id, ()) if t < receipt.timestamp]
        return max(0.0, (receipt.timestamp - max(earlier, default=self._started_ms)) / 1000)

    def _round_seconds_hint(self, round_index: int) -> float:
        """How long a round lasts: receipts arrive after it ended, so their spread understates it."""
        return self.spec.params.target_samples_per_round / max(1.0, sum(self._throughput.values()))

    # ------------------------------------------------------------------ audits

    def _selected_for_audit(self, wire: bytes) -> bool:
        if self.audit_fraction <= 0 or self.workload is None or self.states is None:
            return False
        mac = hmac.new(self._audit_key, wire, hashlib.sha256).digest()
        return int.from_bytes(mac[:8], "big") / 2**64 < self.audit_fraction

    def _audit_loop(self) -> None:
        # On shutdown, the audits already chosen still run (shutdown waits a bounded time for them).
        while not (self._stop.is_set() and self._audits.empty()):
            try:
                sealed: Sealed[ContributionReceipt] = self._audits.get(timeout=1.0)
            except queue.Empty:
                continue
            try:
                self.audit(sealed)
            except Exception as e:
                logger.warning(f"audit of a receipt of round {sealed.record.round} failed to run: {e}")

    def audit(self, sealed: Sealed[ContributionReceipt]) -> bool | None:
        """Replay one accepted receipt; revoke it on a mismatch. None if its start state is unknown."""
        receipt = sealed.record
        state = self.states.state_for(receipt.state_digest, timeout=30.0)
        if state is None:
            self._ledger.run(lambda _: self.counters.update(["audit_skipped"]))
            logger.info(f"audit skipped: no copy of the start state of round {receipt.round}")
            return None
        passed, distance = audit_receipt(self.workload, state, receipt, self.spec.seed)
        self._ledger.run(lambda _: self.counters.update(["audit_passed" if passed else "audit_failed"]))
        if passed:
            logger.info(
                f"audit passed: {receipt.peer_id[-8:]} round {receipt.round} (distance {distance:.1e})"
            )
            return True
        reason = f"{RejectReason.AUDIT_FAILED.value}: recomputed gradient differs (distance {distance:.3g})"
        index, checkpoint = self._ledger.run(lambda _: self._revoke(leaf_hash(sealed.wire), reason))
        self._publish_checkpoint(checkpoint.note)
        logger.warning(f"audit FAILED: {receipt.peer_id[-8:]} round {receipt.round}: entry {index} revoked")
        return False

    def _revoke(self, leaf: bytes, reason: str):
        index = self.store.index_of(leaf)
        checkpoint = self.store.revoke(index, reason, self.identity, task_id=self.task_id)
        self._status[leaf] = {"status": "accepted", "index": index, "revoked": True}
        return index, checkpoint

    # ------------------------------------------------------------------ stopping

    def shutdown(self) -> None:
        try:
            self.close_due_rounds(force=True)
        except Exception as e:
            logger.warning(f"closing the last rounds failed: {e}")
        self._stop.set()
        for t in self._threads:
            t.join(timeout=120)
        size = self._ledger.run(lambda store: store.size)
        logger.info(f"contributions: {dict(sorted(self.counters.items()))}; ledger size {size}")
        for name in (
            submit_handler(self.task_id),
            status_handler(self.task_id),
            credits_handler(self.task_id),
        ):
            self.endpoint.unserve(name)
        self._ledger.close()  # runs what is still queued, then closes the store
