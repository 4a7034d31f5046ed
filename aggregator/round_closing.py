"""Receipts wait for their round to close; then the swarm checks and the intake decide, in one go.

A round closes when peers report working two rounds later and every group it names has all its
members' receipts, or ``close_after`` seconds after its first receipt. Its receipts then pass the
swarm checks (:mod:`aggregator.contribution_checks`: group testimony, plausible samples for the time
and throughput) and the intake appends the survivors in its deterministic order with a signed
checkpoint, in one transaction.

A :class:`RoundCloser` belongs to the ledger's writer thread (:mod:`aggregator.ledger_writer`): its
tables are only touched by jobs there, so it takes no lock of its own.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from aggregator.contribution_checks import SwarmFacts, check_round, lone_inner_step, over_measured_bound
from aggregator.intake import ContributionIntake, Submission
from protocol.records import ContributionReceipt
from protocol.sealing import RejectReason, Sealed, parse_sealed
from protocol.task_spec import TaskSpec

RECEIPT_TIMES_KEPT = 64  # per peer: enough to find a receipt's predecessor within the round window


@dataclass
class ClosedRound:
    """What closing one round decided."""

    round: int
    accepted: list[Sealed[ContributionReceipt]]  # appended, in ledger order (each with its wire)
    refused: list[tuple[bytes, RejectReason, str]] = field(default_factory=list)  # (wire, reason, detail)
    checkpoint_note: str = ""
    ledger_size: int = 0
    # wire -> seconds since its peer's previous receipt (None for a peer's first): a rate's window
    windows: dict[bytes, float | None] = field(default_factory=dict)
    # wires of accepted receipts that nobody else can witness (lone inner steps): only an audit vouches
    audit_only: frozenset[bytes] = frozenset()
    # wires of receipts claiming more than their key's measured rate allows: each is audited
    over_bound: frozenset[bytes] = frozenset()


class RoundCloser:
    def __init__(self, intake: ContributionIntake, spec: TaskSpec, close_after: float, round_window: int):
        self.intake, self.spec = intake, spec
        self.close_after, self.round_window = close_after, round_window
        self._queued: dict[int, list[Submission]] = {}
        self._first_seen: dict[int, float] = {}
        self._arrival: dict[int, list[float]] = {}
        self._attempts: dict[int, set[int]] = {}  # round -> the attempts its receipts name
        # round -> group id -> (the group's size as its receipts say, the keys whose receipts came)
        self._groups: dict[int, dict[str, tuple[int, set[str]]]] = {}
        # Per peer, the timestamps (ms, its clock) of its recent receipts that passed the intake's
        # screening: the time between two of them bounds how long it computed (SwarmFacts.peer_seconds).
        self._receipt_times: dict[str, list[int]] = {}
        self._started_ms = int(time.time() * 1000)

    def add(self, submission: Submission, receipt: ContributionReceipt) -> None:
        """Queue a screened receipt until its round closes."""
        self._queued.setdefault(receipt.round, []).append(submission)
        self._first_seen.setdefault(receipt.round, time.monotonic())
        self._arrival.setdefault(receipt.round, []).append(receipt.timestamp / 1000)
        self._attempts.setdefault(receipt.round, set()).add(receipt.attempt)
        groups = self._groups.setdefault(receipt.round, {})
        groups.setdefault(receipt.group_id, (receipt.group_size, set()))[1].add(receipt.public_key)
        times = self._receipt_times.setdefault(receipt.peer_id, [])
        times.append(receipt.timestamp)
        del times[:-RECEIPT_TIMES_KEPT]

    def waiting(self) -> bool:
        return bool(self._queued)

    def due(self, swarm_round: int, force: bool = False) -> list[int]:
        """The rounds to close now, oldest first (all of them if ``force``): those two rounds behind
        the swarm whose groups' receipts all came (a member's may still be on its way), and those
        ``close_after`` seconds past their first receipt."""
        return [
            r
            for r in sorted(self._queued)
            if force
            or (swarm_round >= r + 2 and self._complete(r))
            or time.monotonic() - self._first_seen[r] > self.close_after
        ]

    def _complete(self, round_index: int) -> bool:
        """Whether every group that ``round_index``'s receipts name has a receipt of each member (a
        member that processed nothing files none: its group's round closes on time alone)."""
        return all(len(keys) >= size for size, keys in self._groups.get(round_index, {}).values())

    def attempts_due(self, swarm_round: int, force: bool = False) -> set[int]:
        """The attempts named by the receipts of the rounds :meth:`due` would close now."""
        return {a for r in self.due(swarm_round, force) for a in self._attempts.get(r, ())}

    def close(
        self, round_index: int, swarm_round: int, throughput: dict[str, float], **checks
    ) -> ClosedRound:
        """Check and append one round's receipts (``throughput``: peer id -> announced samples/s;
        ``checks``: the derived facts of :class:`SwarmFacts` — witnesses, pricing, measured rates)."""
        subs = self._queued.pop(round_index)
        self._first_seen.pop(round_index, None)
        self._attempts.pop(round_index, None)
        self._groups.pop(round_index, None)
        times = self._arrival.pop(round_index, [])
        sealed = [parse_sealed(s.wire, ContributionReceipt) for s in subs]
        hint = self.spec.params.target_samples_per_round / max(1.0, sum(throughput.values()))
        # Receipts arrive after their round ended, so their spread understates how long it lasted.
        durations = {round_index: max(1.0, max(times) - min(times) + hint)}
        windows = {s.wire: self._compute_window(s.record) for s in sealed}
        facts = SwarmFacts(
            swarm_round,
            self.round_window,
            dict(throughput),
            durations,
            self.spec.params.batch_size,
            {(s.record.peer_id, round_index): windows[s.wire] for s in sealed},
            rounds_by_cohort=self.spec.params.sync == "outer",
            task_id=self.spec.task_id,
            **checks,
        )
        refused = check_round(sealed, facts)
        closed = ClosedRound(
            round_index,
            [],
            windows={s.wire: self.measured_window(s.record) for s in sealed},
            audit_only=frozenset(s.wire for s in sealed if lone_inner_step(s.record, facts)),
            over_bound=frozenset(s.wire for s in sealed if over_measured_bound(s.record, facts)),
        )
        closed.refused += [(s.wire, *refused[s.wire]) for s in sealed if s.wire in refused]
        survivors = [sub for sub in subs if sub.wire not in refused]
        result = self.intake.admit(survivors)
        for rejection in result.rejected:
            closed.refused.append((survivors[rejection.position].wire, rejection.reason, rejection.detail))
        closed.accepted = list(result.accepted)
        closed.checkpoint_note, closed.ledger_size = result.checkpoint.note, result.checkpoint.size
        return closed

    def _compute_window(self, receipt: ContributionReceipt) -> float:
        """Seconds between this peer's previous receipt (or, for its first, the desk's start) and
        ``receipt``: the time it can have spent computing that round."""
        return max(0.0, (receipt.timestamp - self._previous_ms(receipt, self._started_ms)) / 1000)

    def _previous_ms(self, receipt: ContributionReceipt, default: int) -> int:
        earlier = [t for t in self._receipt_times.get(receipt.peer_id, ()) if t < receipt.timestamp]
        return max(earlier, default=default)

    def measured_window(self, receipt: ContributionReceipt) -> float | None:
        """Seconds since this peer's previous receipt, or None for its first: what a rate confirmed by
        an audit is measured over (the desk's start says nothing about when a peer began computing)."""
        previous = self._previous_ms(receipt, -1)
        return None if previous < 0 else max(1.0, (receipt.timestamp - previous) / 1000)
