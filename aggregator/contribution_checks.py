"""The checks a round's receipts pass before the ledger takes them, beyond the intake's own.

:mod:`aggregator.intake` checks each receipt alone (signature, binding, task, time, sequence). These
need the swarm: the round window, the averaging group the receipt names, the peer's announced
throughput and the gradient statistics. They return rejections instead of raising, because some of
them (the group) judge receipts against each other.

Group agreement. Members of one averaging group name the same ``group_id`` and list the same
``group_members`` with the same ``group_samples`` (what each declared in the all-reduce). A receipt
is refused when the other members' receipts of its group, by majority, disagree with it: about the
members, or about its own sample count — so a peer cannot claim more samples than its group saw,
nor a group it was not in. (A peer that lies about someone else loses its own receipt; in a group of
two the two receipts contradict each other and both are refused.)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from protocol.records import ContributionReceipt, RejectReason, Sealed

PLAUSIBILITY_SLACK = 3.0  # announced throughput is a recent average; allow bursts up to 3x


@dataclass(frozen=True)
class SwarmFacts:
    """What the aggregator knows about the swarm when it closes a round."""

    current_round: int  # the newest round any peer reports working on
    round_window: int  # receipts for rounds older than current_round - round_window are refused
    throughput: Mapping[str, float]  # peer id -> announced samples/s
    round_seconds: Mapping[int, float]  # round -> how long it took (first to last receipt), >= 1 s
    batch_size: int
    # (peer id, round) -> seconds between that peer's previous receipt and this one, on the peer's own
    # clock. A receipt is written after the round's averaging, so the peer computed this round inside
    # that interval: an upper bound on its compute time that the swarm-wide estimate above is not (a
    # peer that started the round early, or whose last rate was depressed, exceeds the estimate).
    # Timestamps must lie in the intake's window, so a peer cannot stretch its intervals beyond the
    # time that really passed (only move time between its own rounds).
    peer_seconds: Mapping[tuple[str, int], float] = field(default_factory=dict)


def check_round(
    receipts: list[Sealed[ContributionReceipt]], facts: SwarmFacts
) -> dict[bytes, tuple[RejectReason, str]]:
    """Rejections (by wire bytes) among one closing round's signature-checked receipts."""
    rejected: dict[bytes, tuple[RejectReason, str]] = {}
    for sealed in receipts:
        reason = _window(sealed.record, facts) or _finite(sealed.record) or _plausible(sealed.record, facts)
        if reason:
            rejected[sealed.wire] = reason
    by_peer_round = {(s.record.peer_id, s.record.round): s.record for s in receipts}
    for sealed in receipts:
        if sealed.wire in rejected:
            continue
        reason = _group(sealed.record, by_peer_round)
        if reason:
            rejected[sealed.wire] = reason
    return rejected


def _window(r: ContributionReceipt, facts: SwarmFacts) -> tuple[RejectReason, str] | None:
    if r.round > facts.current_round + 1:
        return (
            RejectReason.ROUND_WINDOW,
            f"round {r.round} is ahead of the swarm (round {facts.current_round})",
        )
    if r.round < facts.current_round - facts.round_window:
        return (
            RejectReason.ROUND_WINDOW,
            f"round {r.round} is older than the window of {facts.round_window} rounds",
        )
    return None


def _finite(r: ContributionReceipt) -> tuple[RejectReason, str] | None:
    if not r.grad_sketch or not r.worker_samples or not r.group_samples:
        return RejectReason.NON_FINITE, "the receipt carries no gradient sketch or sample breakdown"
    if all(v == 0 for v in r.grad_sketch):
        return RejectReason.NON_FINITE, "the gradient sketch is all zeros"
    return None


def _plausible(r: ContributionReceipt, facts: SwarmFacts) -> tuple[RejectReason, str] | None:
    rate = facts.throughput.get(r.peer_id)
    seconds = max(facts.round_seconds.get(r.round, 0.0), facts.peer_seconds.get((r.peer_id, r.round), 0.0))
    if rate is None or seconds <= 0:
        return None  # nothing to compare with (the announcement expired): the group check still applies
    # Every worker may finish the mini-batch it started when the round closed.
    limit = rate * seconds * PLAUSIBILITY_SLACK + facts.batch_size * max(1, len(r.worker_samples))
    if r.samples > limit:
        return RejectReason.IMPLAUSIBLE, (
            f"{r.samples} samples in at most {seconds:.1f} s of computing at an announced {rate:.1f} samples/s"
        )
    return None


def _group(
    r: ContributionReceipt,
    by_peer_round: Mapping[tuple[str, int], ContributionReceipt],
) -> tuple[RejectReason, str] | None:
    own = dict(zip(r.group_members, r.group_samples))
    if own.get(r.peer_id) != r.samples:
        return RejectReason.GROUP_MISMATCH, "its own entry in group_samples is not its sample count"
    verdicts = []
    for member in r.group_members:
        if member == r.peer_id:
            continue
        other = by_peer_round.get((member, r.round))
        if other is None:
            continue  # that member's receipt has not arrived (or was refused): no testimony
        agrees = (
            other.group_id == r.group_id
            and other.group_members == r.group_members
            and dict(zip(other.group_members, other.group_samples)).get(r.peer_id) == r.samples
        )
        verdicts.append(agrees)
    if verdicts and sum(not v for v in verdicts) * 2 >= len(verdicts) and not all(verdicts):
        return RejectReason.GROUP_MISMATCH, (
            f"{sum(not v for v in verdicts)} of {len(verdicts)} group member(s) saw another group or sample count"
        )
    return None
