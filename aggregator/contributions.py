"""The aggregator's contribution desk: receipts in, ledger entries, checkpoints, proofs and audits out.

- **Intake.** Peers call ``manta/<task>/submit`` with a sealed receipt. Signature, binding (the
  sender's transport peer id must be the peer the receipt names, bound to its key by the binding the
  sender hands over with it, :mod:`protocol.receipt_delivery`), task and timestamp are checked at once by
  :class:`ContributionIntake`'s rules and a refusal is answered with its reason; otherwise the
  receipt waits for its round to close.
- **Round close** (:mod:`aggregator.round_closing`). A round closes when peers report working two
  rounds later, or ``close_after`` seconds after its first receipt; the swarm checks and the intake
  then append the survivors with a signed checkpoint, whose note is published in the DHT under
  ``manta_<task>_ledger``.
- **Proofs** (:mod:`aggregator.receipt_answers`). ``manta/<task>/status`` (a leaf hash) answers
  queued / accepted with index, inclusion proof and the latest checkpoint note / rejected with the
  reason; ``manta/<task>/credits`` (a public key) answers every entry of that key with proofs,
  revocations and the key's credit.
- **Derived, not believed.** A receipt's sub-networks and FLOPs must be those the task derives for
  its round and cohort (:mod:`aggregator.work_pricing`), and its group one that another peer reported
  committing (:mod:`aggregator.commit_witness`), with samples bounded by the key's measured rate.
- **Audits** (:mod:`aggregator.auditing`, :mod:`aggregator.trust`, :mod:`aggregator.penalties`).
  Every receipt of a new key is replayed from the round's start state until the key has passed a few
  audits, then a fraction of them. A failed audit revokes every credit since the key's last passed
  audit and excludes the key; an audit whose start state cannot be had revokes that receipt.

Concurrency: the ledger has a single writer (:mod:`aggregator.ledger_writer`). The libp2p handlers
(run in threads off the event loop), the round-closing thread and the audits hand it their work and
wait for the result; no DHT call is ever made on the writer (reads come first, publications after).
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from aggregator.admission import AdmissionDesk
from aggregator.auditing import SpotAuditor
from aggregator.audits import AuditResult, Verdict
from aggregator.board_reads import AnnouncementReader, read_swarm_round
from aggregator.call_budget import CallBudget
from aggregator.commit_witness import CommitWitness
from aggregator.desk_network import (
    DeskHandlers,
    publish_binding,
    publish_checkpoint,
    publish_withdrawal,
    published_head,
    serve,
    unserve,
)
from aggregator.intake import ContributionIntake, Submission
from aggregator.ledger_writer import LedgerWriter
from aggregator.penalties import Penalties, excluded_keys
from aggregator.receipt_answers import CreditsBook, credits_reply
from aggregator.receipt_status import ReceiptStatus
from aggregator.round_closing import RoundCloser
from aggregator.round_pace import RoundPace, newest_receipt_round
from aggregator.state_handoff import take_handoff
from aggregator.state_prefetch import StatePrefetcher
from aggregator.trust import TrustBook
from aggregator.work_pricing import WorkPricing
from hivemind_adapter.p2p import Endpoint
from ledger.pinned import extends
from ledger.store import LedgerStore
from protocol.dht_schema import PeerEntry
from protocol.identity import Identity
from protocol.merkle import leaf_hash
from protocol.receipt_delivery import ReceiptDelivery
from protocol.record_lifetimes import PUBLISHED_TTL
from protocol.records import ContributionReceipt
from protocol.sealing import RecordRejected, RejectReason, Sealed, parse_sealed
from protocol.task_spec import TaskSpec

logger = logging.getLogger(__name__)

CONVICTIONS_READ_SECONDS = 10.0  # how often the closer reads the convictions peers posted
STATE_WITNESSES = 2  # peers that must report the same state after a group before a checkpoint takes it
CREDITS_PER_CALLER, CREDITS_OVERALL = 6, 120  # credits calls answered a minute: per peer id, for all
HEX_KEY = re.compile(r"[0-9a-f]{64}")


class LedgerBehind(RuntimeError):
    """The ledger does not extend a checkpoint its aggregator published (one line for the operator)."""


class ContributionDesk:
    """The desk of one task: opens (or creates) the ledger at ``ledger_path``, serves the desk's calls
    on ``endpoint``, publishes its binding and starts the round-closing thread; :meth:`shutdown`
    closes what is due, stops all of it and closes the ledger. ``workload`` (None: no pricing and no
    audits) and ``states`` (the checkpoint keeper: start states for audits, states for checkpoints)
    come from the aggregator; ``audit_fraction`` is the trust book's base audit rate."""

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
        admission: AdmissionDesk | None = None,
    ):
        """``admission``: this aggregator's, whose members (and the keys read announced with a live
        certificate) are the only keys that witness groups and corroborate the swarm's round; None:
        every key counts (a desk without admission, in tests of other parts)."""
        self.dht, self.identity, self.spec = dht, identity, spec
        self.admission = admission
        self.task_id = spec.task_id
        # The ledger, the intake and the tables below belong to the writer thread: every method that
        # touches them runs as a job there (self._ledger.run), never under a lock of its own.
        self._ledger = LedgerWriter(
            lambda: LedgerStore.open(
                ledger_path, create=True, origin=spec.ledger_origin, log_public_key=identity.public_key
            )
        )
        self.store = self._ledger.store
        self._refuse_a_ledger_behind(ledger_path)
        self.intake = ContributionIntake(
            self.store, identity, self.task_id, max_age_ms=spec.params.receipt_window_ms, require_binding=True
        )
        self.rounds = RoundCloser(self.intake, spec, close_after, round_window)
        self.counters: Counter[str] = Counter()  # accepted, each rejection reason, audits (the writer's)
        self.announcements = AnnouncementReader(dht, self.task_id, frozenset(spec.aggregator_keys))
        self.receipts = ReceiptStatus(self.store, self.counters)
        self._credits = CreditsBook(identity.public_key)
        self._credit_calls = CallBudget(CREDITS_PER_CALLER, CREDITS_OVERALL, period=60.0)
        self._stop = threading.Event()
        # Ed25519 signatures are deterministic: a secret only this aggregator can derive, so peers
        # cannot predict which receipts will be audited.
        secret = identity.sign(f"manta-audit-selection/{spec.task_id}".encode())
        self.auditor = SpotAuditor(workload, states, spec.seed, secret, self._on_verdict)
        self.trust = TrustBook(audit_fraction)
        self.penalties = Penalties(
            self._ledger,
            identity,
            self.task_id,
            self.trust,
            self.receipts,
            self.counters,
            self._publish_checkpoint,
            on_excluded=self._withdraw,
        )
        self.witness = CommitWitness(dht, self.task_id, self._is_member)
        self._convictions_read_at = float("-inf")  # (the closer thread's)
        self.pricing = WorkPricing(workload, spec.mode) if workload is not None else None
        self._claimed_rates: dict[bytes, float] = {}  # leaf -> samples/s it claimed, until its audit
        self._prefetcher = StatePrefetcher(states)
        self._ledger.run(lambda _: self._rebuild_trust())
        self.pace = RoundPace(max(1, round_window // 2), self._ledger.run(newest_receipt_round))
        self.states = states
        self.endpoint = endpoint
        # told each closed round's credited samples per peer id (on the ledger's writer thread)
        self.on_closed: Callable[[int, dict[str, int]], None] | None = None
        serve(
            endpoint,
            self.task_id,
            DeskHandlers(self.submit, self.status, self.credits, self.take_witnesses, self.take_state),
        )
        publish_binding(dht, identity, self.task_id)
        self._binding_published_at = time.monotonic()
        self._closer = threading.Thread(target=self._close_loop, name="manta-round-close", daemon=True)
        self._closer.start()

    # ------------------------------------------------------------------ network

    def _refuse_a_ledger_behind(self, ledger_path: Path) -> None:
        """LedgerBehind (the ledger closed) if the DHT still holds a checkpoint this aggregator
        published that its ledger does not extend: a ledger restored from an older copy would
        rewrite credit peers hold proofs of."""
        head = published_head(self.dht, self.identity, self.task_id)
        problem = self._ledger.run(lambda store: extends(store, head)) if head is not None else None
        if problem is not None:
            self._ledger.close()
            raise LedgerBehind(
                f"{ledger_path} is behind the checkpoint this aggregator published (size {head.size}): "
                f"{problem}; start it with the newer ledger"
            )

    def _publish_checkpoint(self, note: str) -> None:
        publish_checkpoint(self.dht, self.identity, self.task_id, note)

    # ------------------------------------------------------------------ handlers

    def submit(self, payload: bytes, sender: str) -> dict:
        """Answer a :class:`ReceiptDelivery` from peer ``sender``: rejected with its reason, or queued
        for its round with ``witnessed`` (whether another peer's report of its group is known here).
        The sender's binding is learned from the delivery alone (the stream authenticated ``sender``);
        a bad one is refused without settling the receipt."""
        try:
            delivery = ReceiptDelivery.from_bytes(payload)
        except ValueError as e:
            return {"status": "rejected", "reason": RejectReason.MALFORMED.value, "detail": str(e)}
        wire = delivery.receipt
        leaf = leaf_hash(wire)
        settled = self._ledger.run(lambda _: self.receipts.settled(leaf))
        if settled is not None:
            return settled
        if delivery.binding is not None:
            refused = self._ledger.run(lambda _: self._bind(delivery.binding, sender))
            if refused is not None:
                return refused
        reply = self._ledger.run(lambda _: self._queue(leaf, wire, sender))
        if reply.get("status") == "queued":
            # Only now, its signature, binding and round checked: reading an attempt moves the window
            # the witness bundles are taken in (a throw-away key's attempt 10^6 would shut them out).
            witnessed = self._read_commits_of(wire)
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

    def take_state(self, payload: bytes, sender: str) -> dict:
        """A leaving peer's state, fetched before it leaves (:func:`aggregator.state_handoff.take_handoff`)."""
        return take_handoff(payload, sender, self.witness, self.states)

    def _bind(self, binding: bytes, sender: str) -> dict | None:
        """Learn ``sender``'s binding (a writer job); the refusal to answer if it is not one."""
        try:
            self.intake.add_binding(binding, sender_peer_id=sender)
        except RecordRejected as e:
            return {"status": "rejected", "reason": e.reason.value, "detail": f"binding: {e.detail}"}
        return None

    def _queue(self, leaf: bytes, wire: bytes, sender: str) -> dict:
        settled = self.receipts.settled(leaf)  # the same bytes may have arrived meanwhile
        if settled is not None:
            return settled
        # The intake's own checks on this receipt alone (nothing is written by screen()).
        screening = self.intake.screen([Submission(wire, sender)])
        if screening.rejected:
            rejection = screening.rejected[0]
            return self.receipts.reject(leaf, rejection.reason, rejection.detail)
        receipt = screening.accepted[0].record
        if self.trust.is_excluded(receipt.public_key):
            return self.receipts.reject(leaf, RejectReason.EXCLUDED, "the key failed an audit of this task")
        self.rounds.add(Submission(wire, sender), receipt)
        queued = self.receipts.queued(leaf, receipt.round)
        if self.states is not None:  # where the round's start state can be fetched for an audit
            self.states.note_holders(receipt.state_digest, [sender])
        return queued

    def status(self, payload: bytes, sender: str) -> dict:
        """Answer ``manta/<task>/status`` for a hex leaf hash (:meth:`ReceiptStatus.answer`)."""
        leaf = bytes.fromhex(payload.decode())
        return self._ledger.run(lambda _: self.receipts.answer(leaf))

    def credits(self, payload: bytes, sender: str) -> dict:
        """Answer ``manta/<task>/credits`` for a hex public key (:func:`credits_reply`), within the
        callers' budget (:mod:`aggregator.call_budget`)."""
        key = payload.decode(errors="replace")
        if not HEX_KEY.fullmatch(key):
            return {"status": "rejected", "detail": "the payload is not a hex Ed25519 public key"}
        if not self._credit_calls.allow(sender):
            return {"status": "rejected", "detail": "too many credits calls: try again in a minute"}
        rows, rewards = self._ledger.run(lambda _: self._credits.entries_of(self.store, key))
        return credits_reply(key, rows, rewards)

    # ------------------------------------------------------------------ rounds

    def _read_commits_of(self, wire: bytes) -> bool:
        """Whether another peer's report of the queued receipt ``wire``'s group is known, reading its
        attempt's commit reports first unless one already is. Why now: the reports expire, and the
        peers storing them may leave, before the round closes."""
        r = parse_sealed(wire, ContributionReceipt).record
        if not self.witness.witnesses(r.attempt, r.group_id) - {r.public_key}:
            self.witness.read([r.attempt])
        return bool(self.witness.witnesses(r.attempt, r.group_id) - {r.public_key})

    def _prefetch_start_state(self, wire: bytes) -> None:
        """Fetch what a queued receipt's audit replays from now (its start state's parameters:
        :mod:`aggregator.state_prefetch`), then (every-step tasks) the whole state its group's
        committers report holding after it: the next
        round's start state, fetched once either way, and the run's last state, which its holders
        serve only until they leave (the stop's final checkpoint). Fetched is not committed: a state is
        checkpointed only once learned (:meth:`_learn_state_after`). The start state only of a receipt
        its key's audit rate selects (or of a key without a measured rate, audited for certain): a
        state can be larger than a slow uplink carries in a round, and most receipts are not audited."""
        if self.states is None or self.trust.base_rate <= 0:
            return
        receipt = parse_sealed(wire, ContributionReceipt).record
        key = receipt.public_key
        if key not in self.trust.measured_rates() or self.auditor.selected(wire, self.trust.audit_rate(key)):
            self._prefetcher.prefetch(receipt.state_digest)
        if self.spec.params.sync != "outer":
            self._prefetcher.run(lambda: self._prefetch_state_after(receipt))

    def _prefetch_state_after(self, receipt: ContributionReceipt) -> None:
        """(On the prefetcher's thread.) A peer files its receipt just before it reports its new
        state: if no state after the group is known yet, the board is read again once."""
        after = self.witness.states_after(receipt.attempt, receipt.group_id)
        if not after:
            self.witness.read([receipt.attempt])
            after = self.witness.states_after(receipt.attempt, receipt.group_id)
        for state, holders in after.items():
            self.states.note_holders(state, sorted(holders))
            self._prefetcher.prefetch(state, whole=True)

    def _rebuild_trust(self) -> None:
        """Keys excluded by earlier failed audits, from the ledger's revocations (a writer job)."""
        for key in excluded_keys(self.store):
            self.trust.exclude(key)

    def _board_round(self, announced: int) -> int:
        """The round members' progress records show (:func:`aggregator.board_reads.read_swarm_round`)."""
        return read_swarm_round(self.dht, self.task_id, announced, self._is_member)

    def _swarm_round(self, announced: int) -> int:
        """The swarm's round as this desk goes by it: the board's, at most :attr:`pace` allows."""
        return self.pace.bound(self._board_round(announced))

    def _is_member(self, key: str) -> bool:
        if self.admission is None:
            return True
        return self.admission.is_member(key) or self.announcements.seen_member(key)

    def _withdraw(self, key: str, reason: str) -> None:
        """An excluded key is no member: refuse its renewals and tell every peer (off the writer)."""
        if self.admission is None:
            return
        withdrawal = self.admission.withdraw(key, reason)
        if withdrawal is not None:
            threading.Thread(
                target=publish_withdrawal, args=(self.dht, withdrawal), name="manta-withdrawal", daemon=True
            ).start()

    def _close_loop(self) -> None:
        while not self._stop.wait(1.0):
            try:
                if time.monotonic() >= self._binding_published_at + PUBLISHED_TTL / 4:
                    # signed anew: peers find this desk by it for as long as the aggregator runs
                    publish_binding(self.dht, self.identity, self.task_id)
                    self._binding_published_at = time.monotonic()
                self._prefetcher.retry_due()
                self.close_due_rounds()
            except Exception as e:
                logger.warning(f"closing rounds failed: {type(e).__name__}: {e}")

    def close_due_rounds(self, force: bool = False) -> None:
        """Exclude newly convicted keys, then close every due round (``force``: every waiting round)
        and publish the last checkpoint. DHT reads come first, off the writer."""
        if force or time.monotonic() >= self._convictions_read_at + CONVICTIONS_READ_SECONDS:
            self._convictions_read_at = time.monotonic()
            self.penalties.exclude_convicted(self.witness.convictions())
        if not self._ledger.run(lambda _: self.rounds.waiting()):
            return
        # DHT reads (each bounded) before the work goes to the writer: handlers must not wait behind them.
        bindings = self.announcements.read()
        swarm_round = self._swarm_round(announced=len(bindings))
        self.witness.read(self._ledger.run(lambda _: self.rounds.attempts_due(swarm_round, force)))
        notes = self._ledger.run(lambda _: self._close_due(swarm_round, bindings, force))
        if notes:
            self._publish_checkpoint(notes[-1])

    def _learn_state_after(self, receipt: ContributionReceipt) -> None:
        """The state its committers hold after the witnessed group of ``receipt``, where at least
        :data:`STATE_WITNESSES` of them report the same one (one dishonest peer cannot name a state
        alone): a checkpoint, and so an anchor, may use it before any receipt of the next round. Not
        in outer tasks (there a period's last state report is posted twice: before and after the
        outer step). Why: a swarm split by a partial roster read could otherwise stay split, neither
        side able to load the state the other committed."""
        if self.spec.params.sync == "outer":
            return
        for state, holders in self.witness.states_after(receipt.attempt, receipt.group_id).items():
            if len(holders) >= STATE_WITNESSES:
                self.states.learn(receipt.round, state, sorted(holders))

    def _close_due(self, swarm_round: int, bindings: list[PeerEntry], force: bool) -> list[str]:
        """Close every due round (a writer job); the checkpoint notes to publish."""
        self.announcements.learn(bindings)
        notes = []
        rates = self.trust.measured_rates()
        for r in self.rounds.due(swarm_round, force):
            closed = self.rounds.close(
                r,
                max(swarm_round, r),
                self.announcements.throughput,
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
                self.receipts.reject(leaf_hash(wire), reason, detail)
                if reason is RejectReason.OUTLIER:  # audited on every receipt again until it passes anew
                    self.trust.suspect(parse_sealed(wire, ContributionReceipt).record.public_key)
            for accepted in closed.accepted:
                leaf = leaf_hash(accepted.wire)
                self.receipts.accept(leaf)
                receipt, key = accepted.record, accepted.record.public_key
                self.pace.accepted(receipt.round)
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
            if self.on_closed is not None and closed.accepted:
                credited = Counter()
                for accepted in closed.accepted:
                    credited[accepted.record.peer_id] += accepted.record.samples
                self.on_closed(r, dict(credited))
            logger.info(
                f"round {r}: {len(closed.accepted)} receipt(s) appended, {len(closed.refused)} refused; "
                f"ledger size {closed.ledger_size}"
            )
            notes.append(closed.checkpoint_note)
        return notes

    # ------------------------------------------------------------------ audits

    def audit(self, sealed: Sealed[ContributionReceipt]) -> AuditResult:
        """Replay one accepted receipt now and act on its verdict."""
        return self.auditor.audit(sealed)

    def _on_verdict(self, sealed: Sealed[ContributionReceipt], result: AuditResult) -> None:
        """An audit's outcome (:class:`SpotAuditor`'s callback): a pass raises the key's trust, an
        unavailable or first marginal one keeps the credit and audits the key until one passes, and a
        failure or second marginal one is a penalty (:mod:`aggregator.penalties`)."""
        leaf, receipt, verdict = leaf_hash(sealed.wire), sealed.record, result.verdict
        self._ledger.run(lambda _: self.counters.update([f"audit_{verdict.value}"]))
        rate = self._claimed_rates.pop(leaf, None)
        key, who = receipt.public_key, f"{receipt.peer_id[-8:]} round {receipt.round}"
        if verdict is Verdict.PASSED:
            index = self._ledger.run(lambda _: self.store.index_of(leaf))
            self.trust.passed(key, index, rate)
        elif verdict is Verdict.UNAVAILABLE:  # no evidence either way
            self.trust.owe(key)
            logger.info(
                f"audit unavailable: {who}: credit kept; the key's receipts are audited until one passes"
            )
        elif verdict is Verdict.MARGINAL:
            after = self.trust.marginal(key)
            if after is not None:
                self.penalties.audit_failed(sealed, result.distance, after=after)
            elif not self.trust.is_excluded(key):
                logger.warning(
                    f"audit marginal: {who} (distance {result.distance:.3g}): credit kept; the key's "
                    "receipts are audited until one passes, and a second marginal one excludes it"
                )
        else:
            self.penalties.audit_failed(sealed, result.distance)

    # ------------------------------------------------------------------ stopping

    def shutdown(self) -> None:
        """Close every waiting round, stop the closer, run the audits already chosen, stop serving
        and close the ledger after what is queued for it."""
        try:
            self.close_due_rounds(force=True)
        except Exception as e:
            logger.warning(f"closing the last rounds failed: {e}")
        self._stop.set()
        self._closer.join(timeout=30)
        self.auditor.stop(timeout=120)  # the audits already chosen still run
        self._prefetcher.shutdown()
        size = self._ledger.run(lambda store: store.size)
        logger.info(f"contributions: {dict(sorted(self.counters.items()))}; ledger size {size}")
        unserve(self.endpoint, self.task_id)
        self._ledger.close()  # runs what is still queued, then closes the store
