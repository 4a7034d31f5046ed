"""One training round of a peer, top to bottom.

::

    plan        = plan_round(directory or roster)     # cohorts by node affinity: the governing
                                                      # directory's, else from who is online
    host        = compute_until_target(plan)          # workers train until the swarm has enough
                                                      # samples, then sum their gradients in the host
    commitments = commit_to(host numerator)           # what the receipt will prove: computed while
                                                      # the round averages, before the step
                                                      # replaces the numerator
    outcome     = averager.average(plan.attempt, ...) # cohort -> across cohorts -> back (hivemind),
                                                      # exact over whoever came; commits once a quorum
                                                      # of the roster holds the same result
    lr          = workers.apply(outcome)              # the same optimizer step everywhere, or none
    receipt     = sign_receipt(...)                   # into the outbox; the courier delivers it
    publish the new state                             # newcomers and laggards download it

Everything a stage hands to the next is a typed value (:mod:`peer.round_types`: a plan,
:class:`~peer.worker_protocol.HostContribution`, commitments,
:class:`~peer.averaging.outcome.AveragingOutcome`), and the round's result is one report. The
collaborators a round needs (DHT, worker pool, averager, outbox, ...) come in one context that the
peer's agent (:mod:`peer.node`) builds once at start-up.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from peer.averaging.outcome import AveragingOutcome
from peer.commit.committer import PendingResult, RoundCommitter
from peer.directory_plan import governing_directory, plan_from_directory
from peer.round_types import (
    Commitments,
    OuterReport,
    RoundContext,
    RoundPlan,
    RoundReport,
    RoundWork,
)
from peer.swarm_progress import SUPERSEDED_READ_EVERY
from peer.worker_pool import WorkerPool
from peer.worker_protocol import Compute, HostContribution
from protocol.averaging_group import averaging_group_id, group_membership
from protocol.cohort_assignment import assign_cohorts, cohort_sizes
from protocol.records import ContributionReceipt
from supernet.contribution import contribution_sketch
from supernet.sketch import encode_sketch
from supernet.state import digest
from supernet.training.schedule import phase_at

logger = logging.getLogger("manta.peer")

COMPUTE_POLL_SECONDS = 0.25  # how often the agent looks at the swarm's progress while workers train


def run_round(ctx: RoundContext, round_index: int, attempt: int) -> RoundReport:
    """Train step ``round_index`` in averaging attempt ``attempt``; never raises for a failed round
    (the report says it aborted and why)."""
    started = time.perf_counter()
    swarm_plan = plan_round(ctx, round_index, attempt)
    roster_seconds = time.perf_counter() - started
    # An outer task's round is an inner step: it averages inside the cohort, whose roster commits it.
    plan = swarm_plan.cohort_only() if ctx.outer is not None else swarm_plan
    averager = ctx.averager_for(plan.cohort)

    # the full plan: a model-parallel cohort trains its own share of sub-networks in every inner step
    host, compute_seconds, ahead = compute_until_target(ctx, swarm_plan)
    if ahead > plan.round_index:
        ctx.workers.apply(round_index, None)
        outcome = sit_out_behind(ctx.commits, plan.attempt, ahead)
        outcome.seconds["roster"] = roster_seconds
        report = _report(ctx, plan, host, outcome, None, compute_seconds, time.perf_counter() - started)
        report.sat_out = True
        return report
    # Averaging is most of a round: the round's record stays fresh meanwhile (a newcomer sits it out).
    with ctx.progress.averaging():
        start_digest = ctx.state_digest()
        # The receipt's commitments read the host's numerator, which nothing overwrites before the
        # optimizer step: they are computed while the round averages (mostly waiting on the network).
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="manta-commitments") as background:
            pending_commitments = background.submit(commit_to, ctx.workers, host, ctx.task.seed, round_index)
            outcome = _average(ctx, plan, averager, host, start_digest)
            t0 = time.perf_counter()
            commitments = pending_commitments.result()
            commit_to_seconds = time.perf_counter() - t0  # what the round waited for them
        outcome = kept_when_leaving(outcome, plan.roster, ctx.peer_id, leaving=ctx.stop.is_set())
        outcome.seconds["roster"], outcome.seconds["commitments"] = roster_seconds, commit_to_seconds
        # aborted behind the swarm (it computes a later round in this attempt): the attempt goes on
        # for longer than a settle waits, and the next one must not start before it ends (seen: a
        # joiner ran each later attempt alone, one ahead); the node waits it out, then catches up
        behind = (
            not outcome.committed and ctx.progress.swarm_round(max_age=SUPERSEDED_READ_EVERY) > round_index
        )
        if not outcome.committed and not ctx.stop.is_set() and not behind:
            averager.settle(plan.attempt, plan.roster)  # the others finish this attempt; then catch up
            outcome = averager.recheck(plan.attempt, plan.roster, outcome)  # its result may commit yet
        work = RoundWork(plan, host, commitments, start_digest)
        if not outcome.committed and outcome.pending is not None and not ctx.stop.is_set():
            # its posted result may still find a quorum (apply_pending_result)
            roster = frozenset(plan.roster) | {ctx.peer_id}
            ctx.commits.hold(
                PendingResult(plan.attempt, roster, outcome.digest, start_digest, averager.public_keys(),
                              time.monotonic(), (work, outcome))
            )  # fmt: skip
        report = finish_round(ctx, work, outcome, compute_seconds, started)
        report.sat_out = behind
        if ctx.outer is not None and report.committed and ctx.outer.settings.is_boundary(round_index):
            report.outer = take_outer_step(ctx, swarm_plan, outcome)
            if report.outer is not None:
                report.seconds += report.outer.blocked_seconds
                report.stages["outer"] = round(report.outer.blocked_seconds, 4)
                report.times["averaging"] = report.times.get("averaging", 0.0) + report.outer.blocked_seconds
    return report


def _average(
    ctx: RoundContext, plan: RoundPlan, averager, host: HostContribution, start_digest: str
) -> AveragingOutcome:
    """The round's averaging (:meth:`peer.averaging.hierarchy.HierarchicalAverager.average`) of the
    host's numerator."""
    return averager.average(
        plan.attempt,
        ctx.workers.host_numerator(),
        host.samples,
        scale=host.scale,
        cohort_size=plan.cohort_size,
        num_cohorts=plan.num_cohorts,
        cohort_rank=plan.cohort_rank,
        state_digest=start_digest,
        expected_peers=plan.roster,
        cohorts=plan.cohorts,
        superseded=lambda: ctx.progress.swarm_round(max_age=SUPERSEDED_READ_EVERY) > plan.round_index,
        known_group=ctx.outer is not None,  # an inner step: the cohort meets as its roster says
    )


def take_outer_step(
    ctx: RoundContext, plan: RoundPlan, round_outcome: AveragingOutcome
) -> OuterReport | None:
    """The end of an outer period, after its last inner step (whose averaging ended in
    ``round_outcome``): the exchange across the whole roster, numbered by the period on the outer
    steps' own board (:mod:`peer.outer_round`; overlapped, the previous period's step is taken now and
    this period's exchange starts). A state the step changed is served and reported as the round's
    state, so cohort members that missed it catch up with it. Taken while leaving too: the others
    count this peer in the exchange's roster."""
    outer = ctx.outer.step(
        plan,
        ctx.outer.settings.period_of(plan.round_index),
        superseded=lambda: ctx.progress.swarm_round(max_age=SUPERSEDED_READ_EVERY) > plan.round_index,
    )
    if outer is None:
        return None
    if outer.committed:
        ctx.publish_state(plan.round_index, plan.attempt)
        ctx.commits.report_state(plan.attempt, round_outcome.report(), ctx.state_digest())
        logger.info(
            f"outer step (attempt {outer.attempt}) at the end of round {plan.round_index}: {outer.contributors} "
            f"contributor(s) in {outer.cohorts} cohort(s), exchange {outer.seconds:.1f} s, round held "
            f"{outer.blocked_seconds:.1f} s, outer state {outer.outer_digest[:12]}"
        )
    else:
        logger.warning(
            f"outer step (attempt {outer.attempt}) at the end of round {plan.round_index} aborted: {outer.reason}"
        )
    return outer


def finish_round(
    ctx: RoundContext, work: RoundWork, outcome: AveragingOutcome, compute_seconds: float, started: float
) -> RoundReport:
    """Apply the round's outcome: the same optimizer step as every peer that committed (or none), a
    signed receipt for what this peer contributed, and the new state served and reported."""
    plan = work.plan
    t0 = time.perf_counter()
    lr = ctx.workers.apply(plan.round_index, outcome.tensors if outcome.committed else None)
    if ctx.outer is not None and outcome.committed:
        ctx.outer.note_inner_step(outcome.tensors)  # model-parallel: the weights this cohort trained
    t1 = time.perf_counter()
    if outcome.committed and work.host.samples > 0:
        receipt = build_receipt(ctx, work, outcome)
        ctx.outbox.add(receipt, ctx.seal_receipt(receipt))
    if outcome.committed:
        ctx.progress.note_committed((c.peer, c.samples) for c in outcome.contributors)
        ctx.commits.drop_pending()  # a new state: no older result applies to it
        ctx.publish_state(plan.round_index, plan.attempt)
        ctx.commits.report_state(plan.attempt, outcome.report(), ctx.state_digest())
    outcome.seconds["apply"], outcome.seconds["publish"] = t1 - t0, time.perf_counter() - t1
    return _report(ctx, plan, work.host, outcome, lr, compute_seconds, time.perf_counter() - started)


def apply_pending_result(ctx: RoundContext) -> RoundReport | None:
    """Before a round: commit the newest aborted round whose posted result a quorum of its roster
    now holds, if this peer's state is still the one that round started from (a head's late
    broadcast can make that quorum after this peer's settle looked). Returns its report (``late``),
    or None."""
    found = ctx.commits.pending_with_quorum(ctx.state_digest())
    if found is None:
        return None
    work, aborted = found.payload
    outcome = replace(
        aborted.as_committed(), seconds={}
    )  # its averaging time is in the aborted round's report
    logger.info(
        f"round {work.plan.round_index} (attempt {work.plan.attempt}): its result reached a quorum "
        f"{time.monotonic() - found.ended:.1f} s after the round ended here: committed late"
    )
    report = finish_round(ctx, work, outcome, 0.0, time.perf_counter())
    report.late = True
    return report


def sit_out_behind(commits: RoundCommitter, attempt: int, ahead: int) -> AveragingOutcome:
    """This peer's state is older than the swarm's, which computes round ``ahead``: its groups (keyed
    by state) would find nobody. It takes no part in ``attempt`` and says so, as a newcomer sitting
    out does: its cohort stops waiting for it, and the attempt's quorum no longer counts it. The round
    loop catches up instead."""
    commits.leave(attempt)
    return AveragingOutcome(committed=False, reason=f"behind the swarm (it computes round {ahead})")


def kept_when_leaving(
    outcome: AveragingOutcome, roster: tuple[str, ...], peer_id: str, *, leaving: bool
) -> AveragingOutcome:
    """The outcome a peer that is leaving applies: none, if it would be the only one holding it.

    Peers stopped together (Ctrl-C to a local swarm, a site going down) finish their round; one that
    had just begun the next finds every other member gone from it and would commit that round alone,
    ending on a state nobody else holds. Leaving anyway, it keeps the state the swarm shares instead.
    A peer that stays goes on alone (it is the swarm now), as does one whose roster held only itself.
    """
    alone = [c.peer for c in outcome.contributors] == [peer_id] and any(p != peer_id for p in roster)
    if not (outcome.committed and leaving and alone):
        return outcome
    return AveragingOutcome(
        committed=False,
        reason="leaving, and every other peer left this round: its result would be this peer's alone",
        seconds=outcome.seconds,
    )


# ------------------------------------------------------------------ the stages, in order


def plan_round(ctx: RoundContext, round_index: int, attempt: int) -> RoundPlan:
    """The cohorts of the directory that governs ``attempt``, if there is one to plan from
    (:mod:`peer.directory_plan`; NotListedYet if it does not list this peer). Otherwise read the
    roster (re-announcing if this peer dropped out of it) and assign cohorts: every peer computes
    the same assignment from the same roster. An outer task's inner step takes the roster read
    while the previous step computed, if it is recent (:func:`read_roster_ahead`)."""
    whole = governing_directory(ctx.directory, attempt)
    if whole is not None:
        plan = plan_from_directory(whole, ctx.peer_id, round_index, attempt)
        ctx.roster_size = len(plan.roster)
        ctx.progress.roster_peers = plan.cohort_size if ctx.progress.rounds_by_cohort else len(plan.roster)
        ctx.progress.members = frozenset(whole.keys().values()) | {ctx.identity.public_key_hex}
        return plan
    roster = _roster_read_ahead(ctx)
    if roster is None:
        roster = ctx.roster.read()
    if ctx.peer_id not in {p.entry.peer_id for p in roster}:
        ctx.announcer.announce()
        roster = ctx.roster.read()
    ctx.roster_size = len(roster)
    assignment = assign_cohorts([p.entry for p in roster], ctx.task.params.max_group_size)
    cohort = assignment.get(ctx.peer_id, f"solo-{ctx.peer_id[-8:]}")
    cohort_ids = sorted(set(assignment.values()) | {cohort})
    sizes = cohort_sizes(assignment)
    peers_of: dict[str, list[str]] = {cohort: [ctx.peer_id]} if ctx.peer_id not in assignment else {}
    for peer, name in sorted(assignment.items()):
        peers_of.setdefault(name, []).append(peer)
    # how many peers could corroborate a progress record (a lone one counts only in a pair)
    ctx.progress.roster_peers = len(peers_of[cohort]) if ctx.progress.rounds_by_cohort else len(roster)
    ctx.progress.members = frozenset(p.announcement.public_key for p in roster) | {
        ctx.identity.public_key_hex
    }
    return RoundPlan(
        round_index,
        attempt,
        cohort,
        cohort_ids.index(cohort),
        len(cohort_ids),
        sizes.get(cohort, 1),
        tuple(p.entry.peer_id for p in roster),
        tuple(tuple(peers_of[name]) for name in cohort_ids),
    )


ROSTER_AHEAD_MAX_AGE = 20.0  # seconds: an older read ahead is read again


def read_roster_ahead(ctx: RoundContext) -> None:
    """An outer task's inner steps: read the roster for the next step in the background while this
    one computes. The read crosses the wide area; a roster a few seconds old is what every read is by
    the end of a round anyway."""
    if ctx.outer is None:
        return
    read = _ROSTER_READER.submit(ctx.roster.read)
    ctx.roster_ahead = (time.monotonic(), read)


def _roster_read_ahead(ctx: RoundContext) -> list | None:
    """The roster read ahead for this round, if there is a recent one that succeeded (None: read now)."""
    ahead, ctx.roster_ahead = ctx.roster_ahead, None
    if ahead is None or time.monotonic() - ahead[0] > ROSTER_AHEAD_MAX_AGE:
        return None
    try:
        return ahead[1].result(timeout=ROSTER_AHEAD_MAX_AGE)
    except Exception as e:  # a failed or hung read: read again, now
        logger.debug(f"the roster read ahead failed: {e}")
        return None


# One thread reads rosters ahead for every agent of this process (a read is bounded by the DHT's timeout).
_ROSTER_READER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="manta-roster-ahead")


def compute_until_target(ctx: RoundContext, plan: RoundPlan) -> tuple[HostContribution, float, int]:
    """Let the workers train until the swarm has (projected) processed the round's target number of
    samples (:mod:`peer.swarm_progress`), until another peer is seen computing a later round (this
    peer is behind), or until Ctrl-C; returns the host's contribution, the computation's wall time and
    the latest round seen computed elsewhere."""
    # the shards of this peer's share that are on disk (it waits, bounded, only for the very first)
    shards = (
        ctx.data.shards_for_round(plan.round_index, plan.roster, ctx.stop) if ctx.data is not None else ()
    )
    ctx.progress.begin(plan.round_index, plan.cohort, ctx.state_round())
    ctx.workers.start_compute(
        Compute(plan.round_index, ctx.task.mode, plan.cohort_rank, plan.num_cohorts, data_shards=shards)
    )
    read_roster_ahead(ctx)
    ahead = -1
    while (host := ctx.workers.computed(timeout=COMPUTE_POLL_SECONDS)) is None:
        if ctx.workers.stop_flag_raised:
            continue  # the workers are finishing their mini-batch and reducing
        estimate = ctx.progress.look(*ctx.workers.progress())
        ahead = max(ahead, estimate.swarm_round)
        ctx.display.computing(
            plan.round_index, estimate.own, estimate.throughput, estimate.swarm, ctx.progress.target
        )
        if ctx.progress.target_reached(estimate) or ctx.stop.is_set() or ahead > plan.round_index:
            ctx.workers.raise_stop_flag()
            ctx.display.averaging(plan.round_index)
    wall = ctx.progress.finish(host.samples, host.loss)
    ctx.announcer.throughput = ctx.progress.throughput  # what the roster shows of this peer next
    return host, wall, ahead


def commit_to(workers: WorkerPool, host: HostContribution, task_seed: int, round_index: int) -> Commitments:
    """The receipt's commitments to the host's gradient numerator, before averaging overwrites it."""
    numerator = workers.host_numerator()
    try:
        sketch = encode_sketch(contribution_sketch(numerator, host.samples, task_seed, round_index))
    except ValueError:  # a non-finite gradient: the receipt says so by carrying no sketch
        sketch = ()
    return Commitments(digest(numerator), tuple(sketch), workers.worker_samples())


def build_receipt(ctx: RoundContext, work: RoundWork, outcome: AveragingOutcome) -> ContributionReceipt:
    """This round's ContributionReceipt: what this peer computed, from which state, in which group."""
    plan, host, commitments, start_digest = work.plan, work.host, work.commitments, work.start_digest
    group = group_membership([(c.peer, c.samples) for c in outcome.contributors], ctx.peer_id)
    task = ctx.task
    return ContributionReceipt(
        task_id=task.task_id,
        round=plan.round_index,
        peer_id=ctx.peer_id,
        public_key=ctx.identity.public_key_hex,
        seq=ctx.outbox.next_seq(),
        cohort_id=plan.cohort,
        subnet_hashes=tuple(dict.fromkeys(host.config_hashes)),
        samples=host.samples,
        flops_per_sample=max(1, host.train_macs // host.samples),
        grad_commitment=commitments.grad_commitment,
        state_digest=start_digest,
        group_id=averaging_group_id(task.task_id, plan.attempt, group, start_digest),
        group_root=group.root,
        group_size=group.size,
        group_index=group.index,
        group_proof=group.proof,
        timestamp=int(time.time() * 1000),
        worker_samples=commitments.worker_samples,
        grad_sketch=commitments.grad_sketch,
        data_shards=tuple(sorted(host.data_shards)),
        attempt=plan.attempt,
        cohort_rank=plan.cohort_rank if task.mode == "model" else 0,
        num_cohorts=plan.num_cohorts if task.mode == "model" else 1,
    )


def _report(
    ctx: RoundContext,
    plan: RoundPlan,
    host: HostContribution,
    outcome: AveragingOutcome,
    lr: float | None,
    compute_seconds: float,
    total: float,
) -> RoundReport:
    averaging = sum(outcome.seconds.get(k, 0.0) for k in ("cohort", "cross", "broadcast"))
    stages = {"compute": compute_seconds} | {
        k: outcome.seconds.get(k, 0.0) for k in ("cohort", "cross", "broadcast", "commit")
    }
    # where "other" went, when known: the roster read, the receipt's commitments (gradient digest and
    # sketch), the optimizer step, the receipt and state served
    stages |= {
        k: outcome.seconds[k] for k in ("roster", "commitments", "apply", "publish") if k in outcome.seconds
    }
    stages["other"] = max(0.0, total - sum(stages.values()))
    if "check" in outcome.seconds:  # within the cohort and cross stages' times: not in the sum above
        stages["check"] = outcome.seconds["check"]
    return RoundReport(
        plan.round_index,
        outcome.committed,
        host.samples,
        host.loss,
        plan.cohort,
        ctx.state_digest(),
        total,
        len(outcome.contributors),
        outcome.reason,
        phase=phase_at(plan.round_index, ctx.train_config).name,
        lr=lr,
        swarm_samples=sum(c.samples for c in outcome.contributors),
        subnets=list(host.config_hashes),
        times=dict(
            compute=compute_seconds,
            averaging=averaging,
            waiting=max(0.0, total - compute_seconds - averaging),
        ),
        stages={k: round(v, 4) for k, v in stages.items()},
        attempt=plan.attempt,
        known_group=outcome.known_group,
    )
