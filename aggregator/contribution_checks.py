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
one group *per cohort*. There the rivalry is judged among the receipts of one cohort (across cohorts,
each cohort's group would outvote or tie the others'). A peer alone in its cohort then has nobody to
contradict it.

Bound to the commit (when the desk supplies ``witnesses``). Rivalry among receipts cannot tell a
group its sender invented alone (a self-only group: nobody else files a receipt for it) from an
honest one. So a receipt's ``group_id`` must hash its own attempt, contributors' root and count and
start state, and a peer other than its sender must have posted, signed, that it committed exactly
that group (:mod:`aggregator.commit_witness`). A peer alone in its cohort of an outer task has no
such witness for its inner steps (its cohort of one commits them alone): their receipts stand only
on an audit. With ``lone_audited`` they pass this check and the desk audits every one of them (a
failed or impossible audit revokes it); without audits they are refused.

Priced and bounded (``pricing``, ``measured_rates``). The sub-networks and FLOPs are derived, not
claimed (:mod:`aggregator.work_pricing`), and samples are bounded by the rate the key's passed audits
confirmed (:mod:`aggregator.trust`), not the throughput it announces. A claim above that bound is
audited, every one, when the desk can audit (``audit_over_bound``), and refused only when it cannot:
a measured rate is measured over the time since the peer's previous receipt, and one round that
waited out aborted attempts can measure an honest peer at a fraction of its speed. Refused, its
later claims would never reach an audit that could measure it again. Audited, an honest claim passes
and raises the measured rate; an inflated one fails, and the failure costs the key every credit
since its last passed audit.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from protocol.averaging_group import GroupMembership, averaging_group_id, proves_membership
from protocol.proof_attestation import Equivocation
from protocol.records import ContributionReceipt
from protocol.sealing import RejectReason, Sealed

PLAUSIBILITY_SLACK = 3.0  # announced throughput is a recent average; allow bursts up to 3x
# A measured rate is already the best a passed audit confirmed: twice it bounds a claim, which keeps
# the expected gain of inflating a receipt negative at any audit rate
# (docs/security.md, "Why cheating does not pay").
MEASURED_SLACK = 2.0


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
    # What the desk derives rather than believes (None: not checked, as in receipt-only unit checks).
    # The keys (hex) that posted a commit of (attempt, group id) (:mod:`aggregator.commit_witness`):
    # a receipt needs a witness other than its sender.
    witnesses: Callable[[int, str], set[str]] | None = None
    # attempt -> group id -> how many keys reported committing it (with ``witnesses``): a group another
    # group of its attempt outnumbers lost the quorum, whatever its receipts say.
    commit_counts: Callable[[int], Mapping[str, int]] | None = None
    # Why a receipt's sub-networks or FLOPs are not the derived ones, or None
    # (:mod:`aggregator.work_pricing`).
    pricing: Callable[[ContributionReceipt], tuple[RejectReason, str] | None] | None = None
    # Samples/s measured for each key (hex) in rounds where its claim was checked (a passed audit);
    # when given, the plausibility bound uses it in place of the announced ``throughput``, and a key
    # without a measured rate has no bound yet (its receipts are audited instead: aggregator.trust).
    measured_rates: Mapping[str, float] | None = None
    task_id: str = ""
    excluded: frozenset[str] = frozenset()  # keys (hex) excluded by a failed audit since they filed
    # (attempt, peer id) -> the keys whose commit reports name that peer an outlier: its values were
    # clipped or dropped by their reducers (robust averaging), so its receipt earns nothing.
    named_outlier: Callable[[int, str], set[str]] | None = None
    # (attempt, peer id, key) -> the evidence that the peer, as a reducer, signed two different proofs
    # in one of the attempt's all-reduces (protocol.proof_attestation): it may have passed any lie.
    equivocation: Callable[[int, str, str], Equivocation | None] | None = None
    # The desk audits every receipt of a peer alone in its cohort's inner step (outer tasks): such a
    # receipt has no witness but may stand on its audit (see lone_inner_step).
    lone_audited: bool = False
    # The desk audits every receipt whose samples exceed the key's measured bound, instead of refusing
    # it (see over_measured_bound).
    audit_over_bound: bool = False


def check_round(
    receipts: list[Sealed[ContributionReceipt]], facts: SwarmFacts
) -> dict[bytes, tuple[RejectReason, str]]:
    """Rejections (by wire bytes) among one closing round's signature-checked receipts."""
    rejected: dict[bytes, tuple[RejectReason, str]] = {}
    for sealed in receipts:
        r = sealed.record
        reason = (
            _excluded(r, facts)
            or _window(r, facts)
            or _finite(r)
            or (facts.pricing(r) if facts.pricing is not None else None)
            or _plausible(r, facts)
            or _witnessed(r, facts)
            or _outlier(r, facts)
            or _equivocated(r, facts)
        )
        if reason:
            rejected[sealed.wire] = reason
    # One testimony per peer and round: how many of the round's peers name each group.
    latest = {(s.record.peer_id, s.record.round): s.record for s in receipts}
    named = Counter((_arena(r, facts), _group_key(r)) for r in latest.values())
    for sealed in receipts:
        if sealed.wire in rejected:
            continue
        if facts.witnesses is not None:
            # Bound to the commit: the peers' signed reports decide between groups, not the receipts
            # filed (a peer excluded or refused for another reason no longer tips a receipt count).
            reason = _proof(sealed.record) or _outnumbered(sealed.record, facts)
        else:
            reason = _group(sealed.record, named, _arena(sealed.record, facts))
        if reason:
            rejected[sealed.wire] = reason
    return rejected


def _excluded(r: ContributionReceipt, facts: SwarmFacts) -> tuple[RejectReason, str] | None:
    if r.public_key in facts.excluded:
        return RejectReason.EXCLUDED, "the key failed an audit of this task while the round was open"
    return None


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
    if facts.measured_rates is not None and facts.audit_over_bound:
        return None  # above the bound it is audited instead (over_measured_bound)
    return _beyond_bound(r, facts)


def over_measured_bound(r: ContributionReceipt, facts: SwarmFacts) -> bool:
    """Whether ``r`` claims more samples than its key's measured rate allows: with
    ``audit_over_bound`` such a receipt is accepted for an audit, which every one of them gets."""
    return facts.measured_rates is not None and facts.audit_over_bound and _beyond_bound(r, facts) is not None


def _beyond_bound(r: ContributionReceipt, facts: SwarmFacts) -> tuple[RejectReason, str] | None:
    if facts.measured_rates is not None:
        rate, slack = facts.measured_rates.get(r.public_key), MEASURED_SLACK
        measured = "a measured"
    else:
        rate, slack = facts.throughput.get(r.peer_id), PLAUSIBILITY_SLACK
        measured = "an announced"
    seconds = max(facts.round_seconds.get(r.round, 0.0), facts.peer_seconds.get((r.peer_id, r.round), 0.0))
    if rate is None or seconds <= 0:
        return None  # nothing to compare with (the announcement expired): the group check still applies
    # Every worker may finish the mini-batch it started when the round closed.
    limit = rate * seconds * slack + facts.batch_size * max(1, len(r.worker_samples))
    if r.samples > limit:
        return RejectReason.IMPLAUSIBLE, (
            f"{r.samples} samples in at most {seconds:.1f} s of computing at {measured} {rate:.1f} samples/s"
        )
    return None


def _witnessed(r: ContributionReceipt, facts: SwarmFacts) -> tuple[RejectReason, str] | None:
    """Bound to the round's commit: the group id must hash the receipt's own attempt, root, count and
    start state, and a peer other than the sender must have posted that it committed this group."""
    if facts.witnesses is None:
        return None
    derived = averaging_group_id(facts.task_id, r.attempt, (r.group_root, r.group_size), r.state_digest)
    if derived != r.group_id:
        return (
            RejectReason.GROUP_MISMATCH,
            "its group id is not that of its attempt, contributors and start state",
        )
    others = facts.witnesses(r.attempt, r.group_id) - {r.public_key}
    if not others and not (facts.lone_audited and lone_inner_step(r, facts)):
        return RejectReason.UNWITNESSED, f"no other peer reported committing its group in attempt {r.attempt}"
    return None


def lone_inner_step(r: ContributionReceipt, facts: SwarmFacts) -> bool:
    """Whether ``r`` is a peer's receipt for an inner step it took alone (an outer task's cohort of
    one): nobody else can witness it, so only an audit can vouch for it."""
    return facts.rounds_by_cohort and r.group_size == 1


OUTLIER_WITNESSES = 2  # reports naming a peer before its receipt is refused: one reducer alone may lie


def _outlier(r: ContributionReceipt, facts: SwarmFacts) -> tuple[RejectReason, str] | None:
    if facts.named_outlier is None:
        return None
    named_by = facts.named_outlier(r.attempt, r.peer_id) - {r.public_key}
    if len(named_by) >= OUTLIER_WITNESSES:
        return RejectReason.OUTLIER, (
            f"{len(named_by)} peers' reducers named its values in attempt {r.attempt} outliers (clipped or dropped)"
        )
    return None


def _equivocated(r: ContributionReceipt, facts: SwarmFacts) -> tuple[RejectReason, str] | None:
    if (
        facts.equivocation is None
        or (found := facts.equivocation(r.attempt, r.peer_id, r.public_key)) is None
    ):
        return None
    return RejectReason.EQUIVOCATED, f"in attempt {r.attempt}: {found.describe()}"


def _group_key(r: ContributionReceipt) -> tuple:
    """What receipts of one group agree on. The id already hashes the rest, but the attempt it also
    hashes is not in the receipt, so the aggregator cannot recompute it: it compares all of them."""
    return r.group_id, r.group_root, r.group_size, r.state_digest


def _arena(r: ContributionReceipt, facts: SwarmFacts) -> tuple:
    """The receipts whose groups compete with this one's: its round's, or its cohort's in that round."""
    return (r.round, r.cohort_id) if facts.rounds_by_cohort else (r.round,)


def _proof(r: ContributionReceipt) -> tuple[RejectReason, str] | None:
    membership = GroupMembership(r.group_root, r.group_size, r.group_index, r.group_proof)
    if not proves_membership(r.peer_id, r.samples, membership):
        return RejectReason.GROUP_MISMATCH, "its group's root does not count it with the samples it claims"
    return None


def _outnumbered(r: ContributionReceipt, facts: SwarmFacts) -> tuple[RejectReason, str] | None:
    """In an every-step task one result per attempt can commit: a group that another group of the
    same attempt matches or outnumbers in commit reports did not (outer tasks number inner steps per
    cohort, so two cohorts' groups may share an attempt: not compared)."""
    if facts.commit_counts is None or facts.rounds_by_cohort:
        return None
    counts = facts.commit_counts(r.attempt)
    own = counts.get(r.group_id, 0)
    rivals = [n for group, n in counts.items() if group != r.group_id]
    if rivals and max(rivals) >= own:
        return RejectReason.GROUP_MISMATCH, (
            f"{max(rivals)} peer(s) reported committing another group of attempt {r.attempt}, {own} this one"
        )
    return None


def _group(r: ContributionReceipt, named: Counter, arena: tuple) -> tuple[RejectReason, str] | None:
    reason = _proof(r)
    if reason:
        return reason
    own = named[arena, _group_key(r)]
    rivals = [n for (where, group), n in named.items() if where == arena and group != _group_key(r)]
    if rivals and max(rivals) >= own:
        return RejectReason.GROUP_MISMATCH, (
            f"{max(rivals)} of the {'cohort' if len(arena) > 1 else 'round'}'s receipts name another group, "
            f"{own} name this one"
        )
    return None
