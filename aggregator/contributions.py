"""The aggregator's contribution desk: receipts in, ledger entries, checkpoints, proofs and audits out.

- **Intake.** Peers call ``manta/<task>/submit`` with a sealed receipt. Signature, binding (the
  sender's transport peer id must be the peer the receipt names, bound to its key by the binding in
  its announcement), task and timestamp are checked at once by :class:`ContributionIntake`'s rules
  and a refusal is answered with its reason; otherwise the receipt waits for its round to close.
- **Round close** (:mod:`aggregator.round_closing`). A round closes when peers report working two
  rounds later, or ``close_after`` seconds after its first receipt; the swarm checks and the intake
  then append the survivors with a signed checkpoint, whose note is published in the DHT under
  ``manta_<task>_ledger``.
- **Proofs.** ``manta/<task>/status`` (a leaf hash) answers queued / accepted with index, inclusion
  proof and the latest checkpoint note / rejected with the reason; ``manta/<task>/credits`` (a public
  key) answers every entry of that key with proofs, revocations and the key's credit.
- **Derived, not believed.** A receipt's sub-networks and FLOPs must be those the task derives for
  its round and cohort (:mod:`aggregator.work_pricing`), and its group one that another peer reported
  committing (:mod:`aggregator.commit_witness`), with samples bounded by the key's measured rate.
- **Audits** (:mod:`aggregator.auditing`, :mod:`aggregator.trust`). Every receipt of a new key is
  replayed from the round's start state until the key has passed a few audits, then a fraction of
  them. A failed audit revokes every credit since the key's last passed audit and excludes the key;
  an audit whose start state cannot be had revokes that receipt.

Concurrency: the ledger has a single writer (:mod:`aggregator.ledger_writer`). The libp2p handlers
(run in threads off the event loop), the round-closing thread and the audits hand it their work and
wait for the result; no DHT call is ever made on the writer (reads come first, publications after).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from aggregator.auditing import SpotAuditor
from aggregator.commit_witness import CommitWitness
from aggregator.intake import ContributionIntake, Submission
from aggregator.ledger_writer import LedgerWriter
from aggregator.round_closing import RoundCloser
from aggregator.trust import CONVICTION_REASON, EXCLUDING_REASONS, EXCLUSION_REASON, TrustBook
from aggregator.work_pricing import WorkPricing
from hivemind_adapter.dht import peer_id, read_signed, store
from hivemind_adapter.p2p import Endpoint
from ledger.rewards import compute_rewards
from ledger.store import LedgerStore
from protocol.corroboration import corroborated_max
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
    witnesses_handler,
)
from protocol.identity import Identity
from protocol.merkle import leaf_hash
from protocol.records import ContributionReceipt, IdentityBinding, ReducerConviction, Revocation
from protocol.sealing import RejectReason, Sealed, parse_sealed, seal
from protocol.task_spec import TaskSpec
from protocol.verified_records import VerifiedRecords

logger = logging.getLogger(__name__)

CONVICTIONS_READ_SECONDS = 10.0  # how often the closer reads the convictions peers posted
STATE_WITNESSES = 2  # peers that must report the same state after a group before a checkpoint takes it

BINDINGS_REFRESH = 10.0  # seconds a read of the peers' announcements serves receipts for


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
        self.rounds = RoundCloser(self.intake, spec, close_after, round_window)
        self.counters: Counter[str] = Counter()  # accepted, each rejection reason, audits (the writer's)
        self._throughput: dict[str, float] = {}  # peer id -> announced samples/s
        # Announcements: each verified once, and re-read from the DHT per receipt only when the sender
        # is not known yet or the last read is older than BINDINGS_REFRESH (not once per receipt).
        self._announcements = VerifiedRecords(lambda sub, value: open_peer_value(spec.task_id, sub, value))
        self._bindings_lock = threading.Lock()  # guards _bindings_read_at and _bound
        self._bindings_read_at = float("-inf")
        self._bound: set[str] = set()  # peer ids whose binding the intake holds
        self._status: dict[bytes, dict] = {}  # leaf hash -> {"status": ..., ...}
        self._stop = threading.Event()
        # Ed25519 signatures are deterministic: a secret only this aggregator can derive, so peers
        # cannot predict which receipts will be audited.
        secret = identity.sign(f"manta-audit-selection/{spec.task_id}".encode())
        self.auditor = SpotAuditor(workload, states, spec.seed, secret, self._on_verdict)
        self.trust = TrustBook(audit_fraction)
        self.witness = CommitWitness(dht, self.task_id)
        self._convictions_read_at = float("-inf")  # (the closer thread's)
        self.pricing = WorkPricing(workload, spec.mode) if workload is not None else None
        self._claimed_rates: dict[bytes, float] = {}  # leaf -> samples/s it claimed, until its audit
        self._prefetched: dict[str, None] = {}  # start states fetched for audits, oldest first
        self._prefetch_lock = threading.Lock()  # guards _prefetched (handler threads)
        self._prefetcher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="manta-audit-prefetch")
        self._ledger.run(lambda _: self._rebuild_trust())
        self.states = states
        self.endpoint = endpoint
        self._register_handlers()
        self._publish_binding()
        self._closer = threading.Thread(target=self._close_loop, name="manta-round-close", daemon=True)
        self._closer.start()

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
            (witnesses_handler(self.task_id), self.take_witnesses),
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
        bindings = self._bindings_for(sender)  # a DHT read if needed: before the work goes to the writer
        witnessed = self._read_commits_of(wire)
        reply = self._ledger.run(lambda _: self._queue(leaf, wire, sender, bindings))
        if reply.get("status") == "queued":
            self._prefetch_start_state(wire)
            # whether another peer's report of its group is known here: if not, its sender hands
            # over the reports it kept (take_witnesses)
            reply = {**reply, "witnessed": witnessed}
        return reply

    def take_witnesses(self, payload: bytes, sender: str) -> dict:
        """A receipt's witnesses, kept by its sender (:meth:`CommitWitness.take_bundle`): sent after
        the receipt, whose arrival read its attempt from the board."""
        try:
            return {"status": "ok", "learned": self.witness.take_bundle(payload)}
        except ValueError as e:
            return {"status": "rejected", "detail": str(e)}

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
        if self.trust.is_excluded(receipt.public_key):
            return self._reject(leaf, RejectReason.EXCLUDED, "the key failed an audit of this task")
        self.rounds.add(Submission(wire, sender), receipt)
        self._status[leaf] = {"status": "queued", "round": receipt.round}
        if self.states is not None:  # where the round's start state can be fetched for an audit
            self.states.note_holders(receipt.state_digest, [sender])
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
        """Peers' signed announcements with their identity bindings (a bounded DHT read; each entry's
        signatures are checked the first time it is seen only)."""
        found = read_signed(self.dht, peers_key(self.task_id), self._announcements.open)
        with self._bindings_lock:
            self._bindings_read_at = time.monotonic()
        return found

    def _bindings_for(self, sender: str) -> list:
        """What a receipt from ``sender`` needs read first: nothing if the last read (recent enough)
        already bound the sender, else a fresh read (a newcomer's first receipt)."""
        with self._bindings_lock:
            fresh = time.monotonic() - self._bindings_read_at < BINDINGS_REFRESH
            if fresh and sender in self._bound:
                return []
        return self._read_bindings()

    def _learn(self, announcements: list) -> None:
        """Take in what :meth:`_read_bindings` found (under the lock)."""
        for announcement, binding in announcements:
            self.intake.bindings[binding.record.peer_id] = binding
            with self._bindings_lock:  # only now may a receipt from this peer skip the read
                self._bound.add(binding.record.peer_id)
            if announcement.record.throughput_milli > 0:
                self._throughput[announcement.record.peer_id] = announcement.record.throughput_milli / 1000

    def _read_commits_of(self, wire: bytes) -> bool:
        """The commit reports of a receipt's attempt, read as the receipt arrives: a peer files it
        after a quorum's reports showed, and they can be gone when the round closes (they expire, and
        the peers storing them may have left). Read again only while no other peer is seen to witness
        the receipt's group; unparseable bytes are the intake's to refuse. Whether another peer's
        report of its group is known now."""
        try:
            r = parse_sealed(wire, ContributionReceipt).record
        except ValueError:
            return False
        if not self.witness.witnesses(r.attempt, r.group_id) - {r.public_key}:
            self.witness.read([r.attempt])
        return bool(self.witness.witnesses(r.attempt, r.group_id) - {r.public_key})

    def _prefetch_start_state(self, wire: bytes) -> None:
        """Fetch a queued receipt's start state now, while the peers that hold it are online: an audit
        runs later (after its round closes, behind other audits), and one whose start state cannot
        be had revokes the receipt. One fetch per state, on one background thread."""
        if self.states is None or self.trust.base_rate <= 0:
            return
        digest = parse_sealed(wire, ContributionReceipt).record.state_digest
        with self._prefetch_lock:
            if digest in self._prefetched:
                return
            self._prefetched[digest] = None
            while len(self._prefetched) > 64:
                self._prefetched.pop(next(iter(self._prefetched)))
        self._prefetcher.submit(self.states.state_for, digest, 30.0)

    def _rebuild_trust(self) -> None:
        """Keys excluded by earlier failed audits, from the ledger's revocations (a writer job)."""
        keys: dict[int, str] = {}
        for index, data in self.store.entries():
            sealed = parse_sealed(data, (ContributionReceipt, Revocation))
            if isinstance(sealed.record, ContributionReceipt):
                keys[index] = sealed.record.public_key
            elif sealed.record.reason.startswith(EXCLUDING_REASONS) and sealed.record.entry_index in keys:
                self.trust.exclude(keys[sealed.record.entry_index])

    def _swarm_round(self, announced: int) -> int:
        """The newest round two peers' progress records show (-1: none); ``announced``: how many
        peers the roster holds (0: the read failed). Corroborated: one peer's record of a far-off round
        must not push every receipt out of the window. A lone record stands only in a swarm of two
        (not when the roster is unknown: then each receipt's own round is the reference): records live
        30 s and honest peers publish only while they compute, so a liar's was at times the only
        one left, and the aggregator refused a whole round's honest receipts as 20 rounds too old
        (the red team's rogue-progress peer on the emulated internet)."""
        records = read_signed(
            self.dht,
            progress_key(self.task_id),
            lambda sub, value: open_progress_value(self.task_id, sub, value),
        )
        return corroborated_max(
            ((r.record.peer_id, r.record.round) for r in records), lone_stands=0 < announced <= 2
        )

    def _close_loop(self) -> None:
        while not self._stop.wait(1.0):
            try:
                self.close_due_rounds()
            except Exception as e:
                logger.warning(f"closing rounds failed: {type(e).__name__}: {e}")

    def close_due_rounds(self, force: bool = False) -> None:
        if force or time.monotonic() >= self._convictions_read_at + CONVICTIONS_READ_SECONDS:
            self._convictions_read_at = time.monotonic()
            self._exclude_convicted(self.witness.convictions())
        if not self._ledger.run(lambda _: self.rounds.waiting()):
            return
        # DHT reads (each bounded) before the work goes to the writer: handlers must not wait behind them.
        bindings = self._read_bindings()
        swarm_round = self._swarm_round(announced=len(bindings))
        self.witness.read(self._ledger.run(lambda _: self.rounds.attempts_due(swarm_round, force)))
        notes = self._ledger.run(lambda _: self._close_due(swarm_round, bindings, force))
        if notes:
            self._publish_checkpoint(notes[-1])

    def _learn_state_after(self, receipt: ContributionReceipt) -> None:
        """The state its committers hold after the witnessed group of ``receipt``, where at least
        :data:`STATE_WITNESSES` of them report the same one (one dishonest peer cannot name a state
        alone): a checkpoint, and so an anchor, may use it before any receipt of the next round.

        Without it, a swarm split in two could stay split for good: one side committed round r with a
        bare majority of the roster it had read (a read that missed some peers), the other side could
        not load that state (no majority of the full roster held it, and the state reports expire
        from the board within 90 s), and neither side could commit round r + 1 alone; the anchor came
        only from round r + 1's receipts (measured on the emulated internet: two sites stuck for 10
        minutes on round 1 after the equivocating reducer's first attempt). Not in outer tasks: there
        a period's last state report is posted twice (before and after the outer step)."""
        if self.spec.params.sync == "outer":
            return
        for state, holders in self.witness.states_after(receipt.attempt, receipt.group_id).items():
            if len(holders) >= STATE_WITNESSES:
                self.states.learn(receipt.round, state, sorted(holders))

    def _exclude_convicted(self, convictions: list[ReducerConviction]) -> None:
        """A key that peers convicted of telling members different stories as a reducer (evidence
        anyone can check: :class:`protocol.records.ReducerConviction`) is treated as one that failed
        an audit: excluded, and every credit since its last passed audit revoked."""
        for conviction in convictions:
            key = conviction.reducer_key
            after = self.trust.convict(key)
            if after is None:
                continue
            reason = (
                f"{CONVICTION_REASON}: reducer {conviction.reducer} signed two different proofs for one "
                "all-reduce; every credit since the key's last passed audit revoked and the key excluded"
            )
            revoked, checkpoint = self._ledger.run(
                lambda _, key=key, after=after, reason=reason: self._revoke_since(key, after, reason)
            )
            if revoked:
                self._publish_checkpoint(checkpoint.note)
            self.counters["convicted"] += 1
            logger.warning(
                f"CONVICTED: {conviction.reducer[-8:]} key {key[:16]} sent different signed proofs "
                f"(posted by {conviction.public_key[:16]}): excluded, {len(revoked)} entr"
                f"{'y' if len(revoked) == 1 else 'ies'} revoked"
            )

    def _close_due(self, swarm_round: int, bindings: list, force: bool) -> list[str]:
        """Close every due round (a writer job); the checkpoint notes to publish."""
        self._learn(bindings)
        notes = []
        rates = self.trust.measured_rates()
        for r in self.rounds.due(swarm_round, force):
            closed = self.rounds.close(
                r,
                max(swarm_round, r),
                self._throughput,
                witnesses=self.witness.witnesses,
                commit_counts=self.witness.commit_counts,
                named_outlier=self.witness.named_outlier,
                equivocation=self.witness.equivocation,
                pricing=self.pricing.check if self.pricing is not None else None,
                measured_rates=rates,
                excluded=frozenset(self.trust.excluded()),
                lone_audited=self.trust.base_rate > 0 and self.states is not None,
                audit_over_bound=self.trust.base_rate > 0 and self.states is not None,
            )
            for wire, reason, detail in closed.refused:
                self._reject(leaf_hash(wire), reason, detail)
                if reason is RejectReason.OUTLIER:  # audited on every receipt again until it passes anew
                    self.trust.suspect(parse_sealed(wire, ContributionReceipt).record.public_key)
            for accepted in closed.accepted:
                leaf = leaf_hash(accepted.wire)
                self._status[leaf] = {"status": "accepted", "index": self.store.index_of(leaf)}
                self.counters["accepted"] += 1
                receipt, key = accepted.record, accepted.record.public_key
                lone = accepted.wire in closed.audit_only
                if self.states is not None and not lone:
                    # a start state the swarm committed (its group is witnessed): checkpoints may use it
                    self.states.learn(receipt.round - 1, receipt.state_digest, [receipt.peer_id])
                    self._learn_state_after(receipt)
                # a key whose rate was never measured has its claim checked by an audit instead, a lone
                # inner step has nothing else to vouch for it, and a claim above the measured bound
                # stands only on its audit
                certain = lone or accepted.wire in closed.over_bound or key not in rates
                fraction = 1.0 if certain else self.trust.audit_rate(key)
                if self.trust.base_rate > 0 and self.auditor.selected(accepted.wire, fraction):
                    window = closed.windows.get(accepted.wire)
                    if window is not None:
                        self._claimed_rates[leaf] = accepted.record.samples / window
                    self.auditor.enqueue(accepted)
            logger.info(
                f"round {r}: {len(closed.accepted)} receipt(s) appended, {len(closed.refused)} refused; "
                f"ledger size {closed.ledger_size}"
            )
            notes.append(closed.checkpoint_note)
        return notes

    # ------------------------------------------------------------------ audits

    def audit(self, sealed: Sealed[ContributionReceipt]) -> bool | None:
        """Replay one accepted receipt now (revoked on a mismatch); None if its start state is unknown."""
        return self.auditor.audit(sealed)

    def _on_verdict(self, sealed: Sealed[ContributionReceipt], passed: bool | None, distance: float) -> None:
        outcome = "audit_unavailable" if passed is None else "audit_passed" if passed else "audit_failed"
        leaf, receipt = leaf_hash(sealed.wire), sealed.record
        self._ledger.run(lambda _: self.counters.update([outcome]))
        rate = self._claimed_rates.pop(leaf, None)
        if passed:
            index = self._ledger.run(lambda _: self.store.index_of(leaf))
            self.trust.passed(receipt.public_key, index, rate)
            return
        if passed is None:  # no evidence of cheating, but no credit for work nobody can check
            reason = f"{RejectReason.AUDIT_UNAVAILABLE.value}: its start state could not be fetched"
            revoked, checkpoint = self._ledger.run(lambda _: self._revoke([leaf], reason))
            self._publish_checkpoint(checkpoint.note)
            logger.warning(f"audit impossible: {receipt.peer_id[-8:]} round {receipt.round}: entry revoked")
            return
        after = self.trust.failed(receipt.public_key)
        reason = (
            f"{EXCLUSION_REASON}: round {receipt.round}: recomputed gradient differs (distance {distance:.3g}); "
            "every credit since the key's last passed audit revoked and the key excluded"
        )
        revoked, checkpoint = self._ledger.run(
            lambda _: self._revoke_since(receipt.public_key, after, reason)
        )
        self._publish_checkpoint(checkpoint.note)
        logger.warning(
            f"audit FAILED: {receipt.peer_id[-8:]} round {receipt.round}: key {receipt.public_key[:16]} "
            f"excluded, {len(revoked)} entr{'y' if len(revoked) == 1 else 'ies'} revoked"
        )

    def _revoke_since(self, key: str, after: int, reason: str):
        """Revoke every receipt of ``key`` past ledger index ``after`` not revoked yet (a writer job)."""
        owned, revoked = [], set()
        for index, data in self.store.entries(max(0, after + 1)):
            sealed = parse_sealed(data, (ContributionReceipt, Revocation))
            if isinstance(sealed.record, Revocation):
                revoked.add(sealed.record.entry_index)
            elif sealed.record.public_key == key:
                owned.append(index)
        return self._revoke([self.store.leaf_hash(i) for i in owned if i not in revoked], reason)

    def _revoke(self, leaves: list[bytes], reason: str):
        """Revoke the entries of ``leaves`` in one batch (a writer job); their indices and the checkpoint."""
        indices = [self.store.index_of(leaf) for leaf in leaves]
        checkpoint = self.store.revoke_many(indices, reason, self.identity, task_id=self.task_id)
        for leaf, index in zip(leaves, indices):
            self._status[leaf] = {"status": "accepted", "index": index, "revoked": True}
        return indices, checkpoint

    # ------------------------------------------------------------------ stopping

    def shutdown(self) -> None:
        try:
            self.close_due_rounds(force=True)
        except Exception as e:
            logger.warning(f"closing the last rounds failed: {e}")
        self._stop.set()
        self._closer.join(timeout=30)
        self.auditor.stop(timeout=120)  # the audits already chosen still run
        self._prefetcher.shutdown(wait=False, cancel_futures=True)
        size = self._ledger.run(lambda store: store.size)
        logger.info(f"contributions: {dict(sorted(self.counters.items()))}; ledger size {size}")
        for name in (
            submit_handler(self.task_id),
            status_handler(self.task_id),
            credits_handler(self.task_id),
            witnesses_handler(self.task_id),
        ):
            self.endpoint.unserve(name)
        self._ledger.close()  # runs what is still queued, then closes the store
