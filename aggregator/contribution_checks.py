"""The checks a round's receipts pass before the ledger takes them, beyond the intake's own.

:mod:`aggregator.intake` checks each receipt alone (signature, binding, task, time, sequence). These
need the swarm: the round window, the averaging group the receipt names, the peer's announced
throughput and the gradient statistics. They return rejections instead of raising, because some of
them (the group) judge receipts against each other.

Group agreement. A receipt names its averaging group by ``group_id`` (attempt, start state and the
Merkle root over every contributor's sample count) and proves, with an inclusion proof, that this
root counts it with exactly the samples it claims (:mod:`protocol.averaging_group`). A round commits
one result, over one set of contributors, on every peer that commits it (the commit quorum), and only
committed rounds produce receipts: honest receipts of one round all name one group. So a receipt is
refused when its proof does not hold (it claims samples its group did not count), or when another
group is named by at least as many of the round's receipts as its own — a peer that inflates its
count or invents a group names a group of its own, which nobody else names. (In a group of two the
two receipts contradict each other and both are refused.) Receipts are compared by root, never by
member list: nothing here grows with the group beyond one count per group id.

An outer task (``sync = "outer"``) is the exception to "one result per round": between outer steps
each cohort takes its inner steps apart and commits its own result, so a round's honest receipts name
one group *per cohort*. There the rivalry is judged among the receipts of one cohort (before, 21-28
of every peer's 30 inner-step receipts were refused on the emulated internet, each cohort's group
outvoting or tying the others'). A peer alone in its cohort then has nobody to contradict it: its
receipt stands on its proof and the plausibility bound.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

from protocol.averaging_group import GroupMembership, proves_membership
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
    # sync = "outer": every cohort commits its own inner steps, so groups are compared within a cohort
    rounds_by_cohort: bool = False


def check_round(
    receipts: list[Sealed[ContributionReceipt]], facts: SwarmFacts
) -> dict[bytes, tuple[RejectReason, str]]:
    """Rejections (by wire bytes) among one closing round's signature-checked receipts."""
    rejected: dict[bytes, tuple[RejectReason, str]] = {}
    for sealed in receipts:
        reason = _window(sealed.record, facts) or _finite(sealed.record) or _plausible(sealed.record, facts)
        if reason:
            rejected[sealed.wire] = reason
    # One testimony per peer and round: how many of the round's peers name each group.
    latest = {(s.record.peer_id, s.record.round): s.record for s in receipts}
    named = Counter((_arena(r, facts), _group_key(r)) for r in latest.values())
    for sealed in receipts:
        if sealed.wire in rejected:
            continue
        reason = _group(sealed.record, named, _arena(sealed.record, facts))
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
    if not r.grad_sketch or not r.worker_samples:
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


def _group_key(r: ContributionReceipt) -> tuple:
    """What receipts of one group agree on. The id already hashes the rest, but the attempt it also
    hashes is not in the receipt, so the aggregator cannot recompute it: it compares all of them."""
    return r.group_id, r.group_root, r.group_size, r.state_digest


def _arena(r: ContributionReceipt, facts: SwarmFacts) -> tuple:
    """The receipts whose groups compete with this one's: its round's, or its cohort's in that round."""
    return (r.round, r.cohort_id) if facts.rounds_by_cohort else (r.round,)


def _group(r: ContributionReceipt, named: Counter, arena: tuple) -> tuple[RejectReason, str] | None:
    membership = GroupMembership(r.group_root, r.group_size, r.group_index, r.group_proof)
    if not proves_membership(r.peer_id, r.samples, membership):
        return RejectReason.GROUP_MISMATCH, "its group's root does not count it with the samples it claims"
    own = named[arena, _group_key(r)]
    rivals = [n for (where, group), n in named.items() if where == arena and group != _group_key(r)]
    if rivals and max(rivals) >= own:
        return RejectReason.GROUP_MISMATCH, (
            f"{max(rivals)} of the {'cohort' if len(arena) > 1 else 'round'}'s receipts name another group, "
            f"{own} name this one"
        )
    return None
