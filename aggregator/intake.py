"""Contribution intake: check a round's sealed receipts and append the accepted ones to the ledger.

Contract:

* ``ContributionIntake(store, signer, task_id, *, max_age_ms, max_ahead_ms, bindings=None,
  require_binding=False, checks=(), clock=None)``.
* ``screen(submissions) -> Screening``: the verdict on each submission, nothing written.
* ``admit(submissions) -> IntakeResult``: screen, then append the accepted receipts and a signed
  checkpoint in one ledger transaction (all or nothing), then count. A submission is a
  :class:`Submission` (wire bytes and the libp2p peer id it arrived from) or plain wire bytes.
* ``counters``: a ``Counter`` of ``"accepted"`` and of every :class:`RejectReason` value, over the
  life of the intake.

Checks, in this order (the first failure is the reason):

1. ``open_sealed``: size, framing, record type/version, schema (unknown field, wrong type, oversize),
   canonical form, signer, signature (:mod:`protocol.sealing`).
2. task id (``wrong_task``); timestamp within ``[now - max_age_ms, now + max_ahead_ms]``
   (``stale_timestamp``).
3. identity binding (``unbound_peer``): if a binding is known for the receipt's peer id, or
   ``require_binding`` is set, :func:`protocol.records.check_binding` must pass; a sender peer id, when
   given, must be the receipt's peer id.
4. the extra ``checks``: callables ``check(sealed, submission, context) -> None`` that raise
   ``RecordRejected``. They see a :class:`BatchContext` (time, task, store, the batch's receipts that
   passed so far), so later checks (group membership, throughput plausibility, audits) plug in here.
5. sequence numbers, last because they consume state: receipts are taken per key in ascending
   ``seq``; exactly the bytes of an accepted entry again is ``replay``; a ``seq`` not above the key's
   last accepted one (in the ledger or earlier in this batch) is ``out_of_order``. Gaps are allowed (a
   receipt may be lost or refused for another reason; the next one must still be accepted).

Accepted receipts are appended in a deterministic order, sorted by ``(public key, seq)``, so the same
set of submissions gives the same log whatever order they arrived in (and each key's entries stay in
rising seq whatever rounds they claim).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from ledger.store import LedgerStore, StoredCheckpoint
from protocol.identity import Identity
from protocol.merkle import leaf_hash
from protocol.records import ContributionReceipt, IdentityBinding, check_binding
from protocol.sealing import RecordRejected, RejectReason, Sealed, open_sealed

DEFAULT_MAX_AGE_MS = 10 * 60 * 1000
DEFAULT_MAX_AHEAD_MS = 30 * 1000


@dataclass(frozen=True)
class Submission:
    """A sealed receipt as it arrived: its bytes and the libp2p peer id of the sender (if known)."""

    wire: bytes
    sender_peer_id: str | None = None


class Rejection(NamedTuple):
    position: int  # index of the submission in the batch given to screen/admit
    reason: RejectReason
    detail: str


@dataclass
class BatchContext:
    """What checks may consult: the batch's time and task, the ledger, and the batch's receipts.

    ``passed`` holds, in submission order, the receipts that passed every check before the current
    one; ``accepted`` fills in during the final sequence-number step.
    """

    now_ms: int
    task_id: str
    store: LedgerStore
    passed: list[Sealed[ContributionReceipt]] = field(default_factory=list)
    accepted: list[Sealed[ContributionReceipt]] = field(default_factory=list)


Check = Callable[[Sealed[ContributionReceipt], Submission, BatchContext], None]


@dataclass(frozen=True)
class Screening:
    accepted: list[Sealed[ContributionReceipt]]  # in ledger order
    rejected: list[Rejection]  # in submission order


@dataclass(frozen=True)
class IntakeResult(Screening):
    checkpoint: StoredCheckpoint


class ContributionIntake:
    """Checks receipts for one task and appends the accepted ones to its ledger."""

    def __init__(
        self,
        store: LedgerStore,
        signer: Identity,
        task_id: str,
        *,
        max_age_ms: int = DEFAULT_MAX_AGE_MS,
        max_ahead_ms: int = DEFAULT_MAX_AHEAD_MS,
        bindings: Mapping[str, Sealed[IdentityBinding]] | None = None,
        require_binding: bool = False,
        checks: Sequence[Check] = (),
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.signer = signer
        self.task_id = task_id
        self.max_age_ms = max_age_ms
        self.max_ahead_ms = max_ahead_ms
        self.bindings: dict[str, Sealed[IdentityBinding]] = dict(bindings or {})
        self.require_binding = require_binding
        self.checks: list[Check] = list(checks)
        self.clock = clock
        self.counters: Counter[str] = Counter()

    def add_binding(self, wire: bytes, sender_peer_id: str | None = None) -> Sealed[IdentityBinding]:
        """Open (check) a sealed IdentityBinding and remember it for its peer id; RecordRejected if bad.

        Learn bindings only from the peer id they name (``sender_peer_id``, the caller the transport
        authenticated): a binding handed over by anyone else is refused, so nobody can shadow another
        peer's binding.
        """
        binding = open_sealed(wire, IdentityBinding)
        if sender_peer_id is not None and sender_peer_id != binding.record.peer_id:
            raise RecordRejected(
                RejectReason.UNBOUND_PEER,
                f"a binding for peer {binding.record.peer_id} came from {sender_peer_id}",
            )
        self.bindings[binding.record.peer_id] = binding
        return binding

    # -- screening ----------------------------------------------------------------------------
    def screen(self, submissions: Iterable[Submission | bytes]) -> Screening:
        """Verdicts for a batch; nothing is written and no counter moves."""
        subs = [s if isinstance(s, Submission) else Submission(s) for s in submissions]
        ctx = BatchContext(now_ms=int(self.clock() * 1000), task_id=self.task_id, store=self.store)
        rejected: list[Rejection] = []
        candidates: list[tuple[int, Sealed[ContributionReceipt]]] = []
        for position, sub in enumerate(subs):
            try:
                sealed = self._check_stateless(sub, ctx)
            except RecordRejected as exc:
                rejected.append(Rejection(position, exc.reason, exc.detail))
                continue
            candidates.append((position, sealed))
            ctx.passed.append(sealed)
        # Sequence numbers: per key, in ascending seq (ties broken by bytes, so arrival order never matters);
        # this is also the order of the log, which keeps each key's entries in rising seq.
        candidates.sort(key=lambda item: (item[1].public_key, item[1].record.seq, item[1].wire))
        last: dict[bytes, int | None] = {}
        seen: set[bytes] = set()
        for position, sealed in candidates:
            try:
                self._check_sequence(sealed, last, seen)
            except RecordRejected as exc:
                rejected.append(Rejection(position, exc.reason, exc.detail))
                continue
            ctx.accepted.append(sealed)
        rejected.sort()
        return Screening(ctx.accepted, rejected)

    def _check_stateless(self, sub: Submission, ctx: BatchContext) -> Sealed[ContributionReceipt]:
        sealed = open_sealed(sub.wire, ContributionReceipt)
        receipt = sealed.record
        if receipt.task_id != ctx.task_id:
            raise RecordRejected(
                RejectReason.WRONG_TASK, f"receipt for task {receipt.task_id}, not {ctx.task_id}"
            )
        if receipt.timestamp < ctx.now_ms - self.max_age_ms:
            raise RecordRejected(
                RejectReason.STALE_TIMESTAMP,
                f"timestamp {receipt.timestamp} is {ctx.now_ms - receipt.timestamp} ms old",
            )
        if receipt.timestamp > ctx.now_ms + self.max_ahead_ms:
            raise RecordRejected(
                RejectReason.STALE_TIMESTAMP,
                f"timestamp {receipt.timestamp} is {receipt.timestamp - ctx.now_ms} ms in the future",
            )
        binding = self.bindings.get(receipt.peer_id)
        if binding is not None or self.require_binding:
            if binding is None:
                raise RecordRejected(
                    RejectReason.UNBOUND_PEER, f"no identity binding for peer {receipt.peer_id}"
                )
            check_binding(sealed, binding, sub.sender_peer_id)
        elif sub.sender_peer_id is not None and sub.sender_peer_id != receipt.peer_id:
            raise RecordRejected(
                RejectReason.UNBOUND_PEER,
                f"the receipt names peer {receipt.peer_id} but came from {sub.sender_peer_id}",
            )
        for check in self.checks:
            check(sealed, sub, ctx)
        return sealed

    def _check_sequence(
        self, sealed: Sealed[ContributionReceipt], last: dict[bytes, int | None], seen: set[bytes]
    ) -> None:
        key, seq = sealed.public_key, sealed.record.seq
        if key not in last:
            last[key] = self.store.last_seq(key)
        previous = last[key]
        leaf = leaf_hash(sealed.wire)
        if previous is not None and seq <= previous:
            if leaf in seen or self.store.index_of(leaf) is not None:
                raise RecordRejected(
                    RejectReason.REPLAY, f"receipt seq {seq} of this key was already accepted"
                )
            raise RecordRejected(
                RejectReason.OUT_OF_ORDER, f"seq {seq} is not above the key's last accepted seq {previous}"
            )
        last[key] = seq
        seen.add(leaf)

    # -- admitting ----------------------------------------------------------------------------
    def admit(self, submissions: Iterable[Submission | bytes]) -> IntakeResult:
        """Screen a batch and append its accepted receipts with a checkpoint, in one transaction.

        If the append fails (LedgerError), nothing is written and the counters do not move.
        """
        screening = self.screen(submissions)
        checkpoint = self.store.append_batch(screening.accepted, self.signer)
        self.counters["accepted"] += len(screening.accepted)
        self.counters.update(r.reason.value for r in screening.rejected)
        return IntakeResult(screening.accepted, screening.rejected, checkpoint)
