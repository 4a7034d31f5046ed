"""Cohort-first averaging across the swarm: the part of a round that crosses the network.

A peer arrives with its host's contribution reduced (``numerator``: the sum of per-sample gradients
over ``samples``). One attempt then runs up to three hivemind stages, each exact and all-or-nothing:

1. **cohort**: the members of a cohort (same host or network) average their mean gradients, weighted
   by samples, as a known group once the cohort met whole (:mod:`.known_cohort`); the leader is the
   first member that can serve (:func:`~.outcome.leader_of`).
2. **cross**: only leaders meet, in a tree of groups of at most ``cross_group_size``
   (:mod:`.cross_stage`), so one copy of each cohort's vector crosses the wide area.
3. **broadcast**: the leader shares the final vector with its cohort (:mod:`.broadcast`). A round
   of one cohort has none: every member finishes from the cohort stage's identical bytes.

Model-parallel rounds (``per_cohort``) combine the sum over cohorts of each cohort's mean. Every stage
averages per-sample means, so a robust reducer compares like with like. A stage waits for its
partners only as long as recent rounds suggest (:mod:`.stage`) and goes on with whoever came; a
member takes over from a leader that dies before its broadcast. Group keys carry the start state's
digest, so a peer holding an older state meets nobody. Whatever groups formed, the result that
commits is the one a quorum of the roster holds (:mod:`peer.commit`), bit for bit on every peer.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Sequence

import torch

from hivemind_adapter.allreduce import VerifiedAverager
from hivemind_adapter.averager_process import AveragerGone
from peer.averaging import buffers
from peer.averaging.broadcast import Broadcast, broadcast
from peer.averaging.cross_stage import CrossCohortStage, confirm_three
from peer.averaging.cross_tree import cross_groups
from peer.averaging.deadlines import StageDeadlines
from peer.averaging.known_cohort import ARRIVAL_SENDER_TIMEOUTS, KnownCohort
from peer.averaging.outcome import Attempt, AveragingOutcome, Contributor, check_contributors, leader_of
from peer.averaging.settings import AveragerSettings
from peer.averaging.stage import HeadGone, NoGroup, RoundAborted, StageRunner
from peer.commit.committer import RoundCommitter
from peer.guard.partner_checks import PartnerChecks
from peer.guard.peer_guard import PeerGuard
from protocol.averaging_group import averaging_group_id, contributors_root
from protocol.proof_attestation import proofs_fingerprint
from supernet.state import digest

logger = logging.getLogger(__name__)


class HierarchicalAverager:
    """Averages one list of tensors per attempt: cohort, then across cohorts, then back to every
    member. Built by :func:`peer.averaging.factory.build_averager`; its parts are its collaborators:
    the cohort's hivemind averager, the cross-cohort stage, the stage runner, the committer of its
    board, the guard and the partner checks, and the cohort's known-group steps."""

    def __init__(
        self,
        settings: AveragerSettings,
        cohort_averager: VerifiedAverager,
        cross: CrossCohortStage,
        stages: StageRunner,
        committer: RoundCommitter,
        guard: PeerGuard,
        checks: PartnerChecks,
        known: KnownCohort,
    ):
        self.settings, self.cohort, self.peer_id = settings, settings.cohort, settings.peer_id
        self._cohort, self.cross, self.stages = cohort_averager, cross, stages
        self.commits, self.guard, self.checks, self._known = committer, guard, checks, known
        self._last: Attempt | None = None  # the last attempt this averager took part in
        # the cohort's roster peers, if its last cohort stage gathered every one of them, each a server
        self._met_whole: frozenset[str] | None = None

    @property
    def deadlines(self) -> StageDeadlines:
        return self.stages.deadlines

    @property
    def count(self) -> int:
        """The tensors of the vector averaged (the cohort averager's buffer adds the roll)."""
        return self.cross.count

    # ------------------------------------------------------------------ the round

    def average(
        self,
        attempt: int,
        numerator: Sequence[torch.Tensor],
        samples: int,
        *,
        scale: float = 1.0,
        cohort_size: int,
        num_cohorts: int,
        cohort_rank: int = 0,
        state_digest: str = "",
        expected_peers: Collection[str],
        cohorts: Sequence[Collection[str]] = (),
        superseded: Callable[[], bool] = lambda: False,
        known_group: bool = False,
    ) -> AveragingOutcome:
        """Average one attempt's host contributions; never raises for network failures (a failed
        attempt comes back with ``committed=False`` and the reason).

        ``attempt`` is what peers meet on (every participant passes the same, never reused);
        ``numerator`` this host's sum of per-sample gradients over ``samples``; ``cohort_size`` and
        ``num_cohorts`` the sizes the roster expects, ``cohort_rank`` this cohort's place (which tree
        groups its head meets); ``scale`` multiplies a per-cohort result (the same on every peer).
        ``expected_peers``: this peer's roster, a quorum of which must hold the result; ``cohorts``:
        the roster's peers of each cohort by rank (empty: unknown). Only peers that started from
        ``state_digest`` meet. ``superseded``: the swarm moved on to a later round (a peer still looking
        for a group gives up). The cohort's members meet without matchmaking (:mod:`.known_cohort`) if
        its last cohort stage gathered all of them, or at once with ``known_group`` (an outer task's
        inner step).
        """
        member_finishes = num_cohorts == 1
        known_group = known_group and member_finishes
        me = Contributor(self.peer_id, self.cohort, int(samples), state_digest, self.settings.client_mode)
        outcome = AveragingOutcome(committed=False)
        self.stages.begin_attempt(superseded)
        t_start = time.perf_counter()
        final: list[torch.Tensor] | None = None
        stage = ("cohort", t_start)  # the stage in progress: a failure's time is charged to it
        cohort_peers = [tuple(c) for c in cohorts] if len(cohorts) == num_cohorts else []
        previous = self._last.number if self._last is not None else None
        live = self.commits.live_peers(previous, inner_step=known_group) if cohort_peers else None
        tree = (
            cross_groups(cohort_rank, num_cohorts, self.settings.cross_group_size) if num_cohorts > 1 else []
        )
        roster = set(expected_peers) | {self.peer_id}
        self.commits.open_attempt(attempt, roster, cohort_peers)
        now = Attempt(attempt, state_digest, tree, cohort_peers, live, roster=frozenset(roster))
        self._last = now
        self.guard.begin_attempt(attempt)
        try:
            buffers.load(self._cohort, numerator)
            members = self._cohort_stage(now, me, cohort_size, cohort_rank, known_group, outcome)
            outcome.seconds["cohort"] = time.perf_counter() - t_start
            if (noise := self._cohort.take_measured_noise()) is not None:
                now.cohort_noise = noise
            outcome.cohort_members = [m.peer for m in members]
            outcome.leader = leader_of(members)
            # A member keeps what the cohort stage left (the broadcast overwrites it): if the leader
            # dies before its broadcast, the next member carries the cohort's result on in its place.
            takes_over = (
                len(members) > 1
                and outcome.leader != self.peer_id
                and not self.settings.cohort_client_mode
                and not member_finishes
            )
            cohort_result = buffers.snapshot(self._cohort, self.count) if takes_over else None
            receivers = [me] if member_finishes else list(members)  # the broadcast's group
            now.broadcasts_taken = now.levels if member_finishes else 0  # no broadcast to wait out
            while True:
                i_lead = outcome.leader == self.peer_id or member_finishes
                if i_lead:
                    if cohort_result is not None:
                        buffers.load(self._cohort, cohort_result)  # taking over: the cohort's result
                    t0 = time.perf_counter()
                    stage = ("cross", t0)
                    final, outcome.contributors, lead_abort = self.cross.run(now, members, scale)
                    if lead_abort is not None:
                        # its members learn it from its report on the board, which is posted at once;
                        # a broadcast of nothing would cost them a whole matchmaking and all-reduce
                        raise RoundAborted(lead_abort)
                    outcome.seconds["cross"] = time.perf_counter() - t0
                if len(receivers) > 1:
                    t0 = time.perf_counter()
                    stage = ("broadcast", t0)
                    spec = Broadcast(
                        "cohort", len(receivers), outcome.leader, final, outcome.contributors, None,
                        patience=max(1, len(tree)),
                    )  # fmt: skip
                    try:
                        final, lead_report = broadcast(
                            self.stages, self._cohort, self.guard, now, spec, self.count
                        )
                    except HeadGone as e:
                        receivers = [m for m in receivers if m.peer != outcome.leader]
                        successor = leader_of(receivers, servers_only=True)
                        if cohort_result is None or successor is None:
                            raise
                        logger.info(
                            f"attempt {attempt}: {e}; {successor[-8:]} carries the cohort's result on"
                        )
                        outcome.leader = successor
                        outcome.seconds["broadcast"] = (
                            outcome.seconds.get("broadcast", 0.0) + time.perf_counter() - t0
                        )
                        continue
                    if not i_lead:
                        outcome.contributors = [Contributor.from_wire(c) for c in lead_report["contributors"]]
                        check_contributors(outcome.contributors, state_digest)
                    outcome.seconds["broadcast"] = (
                        outcome.seconds.get("broadcast", 0.0) + time.perf_counter() - t0
                    )
                break
            outcome.digest = digest(final)
        except RoundAborted as e:
            outcome.reason = str(e)
            outcome.seconds.setdefault(stage[0], time.perf_counter() - stage[1])
        except Exception as e:  # hivemind reports failures with many exception types; all mean "abort"
            outcome.reason = f"{type(e).__name__}: {e}"
            outcome.seconds.setdefault(stage[0], time.perf_counter() - stage[1])
        return self._conclude(now, outcome, final, roster, t_start)

    def _cohort_stage(
        self,
        now: Attempt,
        me: Contributor,
        cohort_size: int,
        cohort_rank: int,
        known_group: bool,
        outcome: AveragingOutcome,
    ) -> list[Contributor]:
        """The cohort stage (a known group, else matchmaking); returns the members whose mean the
        buffer now holds (this peer alone if its cohort never gathered)."""
        # every stage averages per-sample means weighted by samples
        buffers.to_own_mean(self._cohort, self.count, me.samples)
        members = [me]
        known = None
        roster_cohort = frozenset(now.cohort_peers[cohort_rank]) if now.cohort_peers else frozenset()
        met_whole, self._met_whole = self._met_whole, None
        if roster_cohort and (known_group or met_whole == roster_cohort):
            known = self._known.members(
                roster_cohort, cohort_size, self.peer_id, now.live, self.guard.barred()
            )
        counts = None
        if known is not None:
            counts = self._known.average(
                self._cohort, now.number, known, self.peer_id, me.samples, now.state_digest,
                arrival_timeout=ARRIVAL_SENDER_TIMEOUTS * self.settings.timeouts.next_chunk,
                allreduce_timeout=self.stages.allreduce_bound("cohort"),
                weight=float(me.samples),
            )  # fmt: skip
        if counts is not None:
            members = [Contributor(p, self.cohort, n, now.state_digest, False) for p, n in zip(known, counts)]
            outcome.known_group = True
            confirm_three(self.checks, self.stages, now, "cohort", known, self._cohort)
        else:  # the buffer holds this peer's mean still; a failed known group left its count
            buffers.clear_roll(self._cohort)
        if counts is None and cohort_size > 1:
            try:
                units = [(p,) for p in now.cohort_peers[cohort_rank]] if now.cohort_peers else []
                gathered = self.stages.run(
                    self._cohort, "cohort", now.number, 0, cohort_size, now.state_digest, units=units,
                    live=now.live, weight=float(me.samples), gather=me.to_wire(),
                    quorum_over=0 if now.tree else now.roster_size,  # one cohort: its result is the attempt's
                )  # fmt: skip
                members = sorted((Contributor.from_wire(m) for m in gathered.values()), key=lambda c: c.peer)
                confirm_three(self.checks, self.stages, now, "cohort", list(gathered), self._cohort)
            except NoGroup as e:
                logger.info(f"attempt {now.number}: {e}; this peer goes on as a cohort of one")
        if (
            len(members) > 1
            and {m.peer for m in members} == roster_cohort
            and not any(m.client for m in members)
        ):
            self._met_whole = roster_cohort
        return members

    def _conclude(
        self,
        now: Attempt,
        outcome: AveragingOutcome,
        final: list[torch.Tensor] | None,
        roster: set[str],
        t_start: float,
    ) -> AveragingOutcome:
        """The attempt's evidence into ``outcome``, its report posted and the commit decided."""
        self.guard.take_named()
        evidence = self.guard.evidence
        outcome.outliers, outcome.proofs = list(evidence.outliers()), list(evidence.proofs())
        outcome.checked = list(evidence.checked)
        if evidence.check_seconds:
            outcome.seconds["check"] = evidence.check_seconds
        if outcome.outliers:
            logger.warning(
                f"attempt {now.number}: values of {', '.join(p[-8:] for p in outcome.outliers)} were outliers"
            )
        t0 = time.perf_counter()
        committed, reason = self._commit(now, outcome, roster)
        outcome.seconds["commit"] = time.perf_counter() - t0
        outcome.seconds["total"] = time.perf_counter() - t_start
        outcome.regrouped = list(self.stages.regrouped)
        if committed and final is not None:
            outcome.committed, outcome.tensors = True, final  # fresh tensors, not views of the shared buffer
        else:
            if final is not None and not outcome.reason:  # posted as a result: it may still commit late
                outcome.pending = final
            outcome.reason = outcome.reason or reason
            logger.warning(
                f"attempt {now.number}: averaging aborted, keeping previous values ({outcome.reason})"
            )
        return outcome

    def _commit(self, now: Attempt, outcome: AveragingOutcome, roster: set[str]) -> tuple[bool, str]:
        """Post this peer's report; commit once a quorum of ``roster`` holds the same result (a known
        group that is the whole roster confirms it among its members instead)."""
        attempt = now.number
        if not outcome.reason and outcome.digest:
            members = [(c.peer, c.samples) for c in outcome.contributors]
            outcome.group = averaging_group_id(
                self.settings.run_id, attempt, contributors_root(members), now.state_digest
            )
        report = outcome.report()
        self.commits.post_result(attempt, report)
        if not report.ok:
            return False, outcome.reason
        if roster == {self.peer_id}:  # a roster of one: its quorum is this peer
            self.commits.note_everyone_posted(attempt, roster)
            return True, ""
        members = tuple(outcome.cohort_members)
        if outcome.known_group and set(members) == roster:
            # every member confirms the result and the proofs it took with it (a reducer that
            # equivocated gave members different ones: then the board decides, and shows it)
            confirmed = proofs_fingerprint(outcome.digest, outcome.proofs)
            bound = self.stages.allreduce_bound("cohort")
            if self._known.confirm(
                self._cohort, attempt, members, self.peer_id, confirmed, now.state_digest, bound
            ):
                self.commits.note_everyone_posted(attempt, roster)
                return True, ""
        # It also waits out the broadcasts it had no part in, as long as they may take.
        skipped = max(0, now.levels - now.broadcasts_taken) * self.deadlines.deadline("broadcast").seconds
        witnesses = [c.peer for c in outcome.contributors if c.peer != self.peer_id]
        decision = self.commits.await_quorum(
            attempt, outcome.digest, roster, extra_seconds=skipped, witnesses=witnesses,
            public_keys=self.guard.public_keys(),
        )  # fmt: skip
        self.guard.after_decision(attempt, decision, witnesses, self.commits.board)
        return decision.committed, decision.reason

    # ------------------------------------------------------------------ after the attempt

    def settle(self, attempt: int, roster: Collection[str]) -> bool:
        """After this peer's ``attempt`` failed: :meth:`peer.commit.committer.RoundCommitter.settle`."""
        return self.commits.settle(attempt, roster, self._last.levels if self._last is not None else 1)

    def recheck(self, attempt: int, roster: Collection[str], outcome: AveragingOutcome) -> AveragingOutcome:
        """After :meth:`settle`: ``outcome`` committed if its posted result found a quorum after all."""
        if outcome.committed or outcome.pending is None:
            return outcome
        if self.commits.quorum_now(attempt, roster, outcome.digest, self.guard.public_keys()):
            return outcome.as_committed()
        return outcome

    def own_cohort_peers(self) -> tuple[str, ...] | None:
        """The roster's peers of this peer's cohort in the last attempt (None: not known)."""
        if self._last is None:
            return None
        return next((c for c in self._last.cohort_peers if self.peer_id in c), None)

    def barred_for(self) -> dict[str, float]:
        return self.guard.barred_for()

    def public_keys(self) -> dict[str, str] | None:
        return self.guard.public_keys()

    def cross_cohort_bytes(self) -> int:
        """Tensor payload bytes this averager moved across cohorts so far."""
        return self.cross.wire_bytes()

    def ended(self) -> str | None:
        """Why this averager can no longer average (a process of it ended), or None while both run."""
        for averager in (self._cohort, self.cross.averager):
            try:
                averager.check_alive()
            except AveragerGone as e:
                return str(e)
        return None

    def shutdown(self) -> None:
        for averager in (self._cohort, self.cross.averager):
            if averager.is_alive():
                averager.shutdown()
            else:  # ended without a shutdown: what it left in /tmp
                averager.remove_socket_file()
