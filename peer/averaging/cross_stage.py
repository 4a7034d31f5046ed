"""A cohort's head across cohorts: up the cross-cohort tree (:mod:`.cross_tree`) and back down."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch

from hivemind_adapter.allreduce import VerifiedAverager
from hivemind_adapter.wire_codecs import codec_for, roundtrip
from peer.averaging import buffers
from peer.averaging.broadcast import Broadcast, broadcast
from peer.averaging.cross_tree import JoinedGroup, TreeGroup, units_of
from peer.averaging.outcome import Attempt, Contributor, check_contributors
from peer.averaging.settings import AveragerSettings
from peer.averaging.stage import QUORUM_GATHER_PERIODS, NoGroup, RoundAborted, StageRunner
from peer.commit.quorum import is_quorum, members_of
from peer.guard.partner_checks import CheckFailed, PartnerChecks
from peer.guard.peer_guard import PeerGuard
from robust_aggregation.centered_clip import without_negative_zeros

logger = logging.getLogger(__name__)


def confirm_three(
    checks: PartnerChecks,
    stages: StageRunner,
    attempt: Attempt,
    stage: str,
    peers: Sequence[str],
    averager: VerifiedAverager,
) -> None:
    """:meth:`PartnerChecks.check` of a stage's all-reduce, bounded by that stage's all-reduce bound;
    raises :class:`RoundAborted` if the partners do not confirm."""
    try:
        checks.check(attempt.number, stage, peers, averager, stages.allreduce_bound(stage.partition("/")[0]))
    except CheckFailed as e:
        raise RoundAborted(str(e)) from None


class CrossCohortStage:
    """The cross-cohort part of a head's round, on the cross averager (which shares the cohort
    averager's tensors: without a cross stage the cohort's result is already where it is read)."""

    def __init__(
        self,
        settings: AveragerSettings,
        averager: VerifiedAverager,
        stages: StageRunner,
        guard: PeerGuard,
        checks: PartnerChecks,
        count: int,
    ):
        """``count``: the tensors of the round's vector."""
        self.settings, self.averager, self.stages = settings, averager, stages
        self.guard, self.checks, self.count = guard, checks, count
        self.compression = codec_for(settings.cross_codec)

    def run(
        self, attempt: Attempt, members: list[Contributor], factor: float
    ) -> tuple[list[torch.Tensor] | None, list[Contributor], str | None]:
        """Up the tree and back down. Returns the final vector (None if aborted), its contributors and
        why it aborted (None if it did not). A group that never forms leaves the result below it
        standing alone at that level; an abort on the way travels down with the result's place."""
        me = self.settings.peer_id
        # A pair's reducer has no others' spread to be held to: each head holds it to the noise its
        # own cohort stage measured (where both stages average per-sample means).
        noise = attempt.cohort_noise if self.settings.holds_pairs_to_noise else None
        self.averager.set_noise_reference(noise)
        contributors, cohorts, joined, abort = self._climb(attempt, members)
        final = None
        if abort is None and (not joined or joined[-1].head == me):
            try:  # this peer carried the result as far as it went: it computes the final vector
                check_contributors(contributors, attempt.state_digest)
                final = buffers.final_vector(
                    self.averager, contributors, len(cohorts), factor, self.settings.per_cohort
                )
                if self.settings.cross_codec != "none" and len(attempt.tree) > 1:
                    # the way down crosses the same lossy wires: values already in the codec's form
                    # cross unchanged, so every head ends with the bytes whose digest it announces
                    final = [roundtrip(self.compression, t) for t in final]
                # as every reducer of a broadcast gives them back (into the fresh tensors made above)
                final = without_negative_zeros(final, in_place=True)
            except RoundAborted as e:
                abort = str(e)
            if abort is None and (short := self._short_of_quorum(attempt, contributors)) is not None:
                abort, final = short, None  # nobody below need wait for a result that cannot commit
        for step in reversed(joined):
            i_head = step.head == me
            spec = Broadcast(
                "cross", step.participants, step.head, final, contributors, abort, level=step.group.level,
                group=step.group.index, patience=len(attempt.tree), what="cross-cohort head",
            )  # fmt: skip
            try:
                received, report = broadcast(
                    self.stages, self.averager, self.guard, attempt, spec, self.count
                )
                if not i_head:
                    contributors = [Contributor.from_wire(c) for c in report["contributors"]]
                    check_contributors(contributors, attempt.state_digest)
                    final = received
            except RoundAborted as e:
                if not i_head:  # the groups this peer leads below learn it on the way down
                    final, abort = None, str(e)
                elif abort is None:  # a head keeps its result; the members that missed it know it
                    logger.info(f"attempt {attempt.number}: level {step.group.level} broadcast: {e}")
        return final, contributors, abort

    def _climb(
        self, attempt: Attempt, members: list[Contributor]
    ) -> tuple[list[Contributor], list[str], list[JoinedGroup], str | None]:
        """Average this cohort's result up the tree as long as this peer heads what it carries.
        Returns the contributors and cohorts now in the buffer, the groups below the top it met (the
        last one's head goes on if it is not this peer) and why the climb broke (None if it did not)."""
        me, settings = self.settings.peer_id, self.settings
        contributors = sorted(members, key=lambda c: c.peer)
        cohorts = [settings.cohort]
        joined: list[JoinedGroup] = []
        for group in attempt.tree:
            if group.size <= 1:
                continue  # the only unit of its group: nothing to average at this level
            # weights: the samples behind the mean in the buffer, or cohorts (a sum of cohort means)
            weight = float(len(cohorts) if settings.per_cohort else sum(c.samples for c in contributors))
            report = {
                "cohorts": cohorts,
                "members": [c.to_wire() for c in contributors],
                "client": settings.client_mode,
            }
            top = group.level == len(attempt.tree)  # its result is the attempt's: it must hold a quorum
            try:
                gathered = self.stages.run(
                    self.averager, "cross", attempt.number, 0, group.size, attempt.state_digest,
                    level=group.level, group=group.index, patience=group.level, units=self._units(attempt, group),
                    live=attempt.live, weight=weight, gather=report, quorum_over=attempt.roster_size if top else 0,
                    gather_periods=QUORUM_GATHER_PERIODS,  # a head it starts without loses its cohort's round
                )  # fmt: skip
            except NoGroup as e:
                logger.info(f"attempt {attempt.number}: {e}; level {group.level} goes on with what it has")
                continue
            except RoundAborted as e:
                return contributors, cohorts, joined, str(e)
            try:
                cohorts = [str(name) for r in gathered.values() for name in r["cohorts"]]
                contributors = sorted(
                    (Contributor.from_wire(m) for r in gathered.values() for m in r["members"]), key=lambda c: c.peer
                )  # fmt: skip
            except (KeyError, TypeError) as e:
                return contributors, cohorts, joined, f"a malformed cross-cohort report: {e}"
            except RoundAborted as e:
                return contributors, cohorts, joined, str(e)
            if len({c.peer for c in contributors}) != len(contributors):
                # a peer whose all-reduce broke only for itself went on alone while its group kept it
                return contributors, cohorts, joined, "a contributor reached the cross stage twice"
            if settings.per_cohort and len(set(cohorts)) != len(cohorts):
                # a cohort that split would count its sub-networks twice
                return contributors, cohorts, joined, "a cohort reached the cross stage in two parts"
            try:
                stage = f"cross/{group.level}/{group.index}"
                confirm_three(self.checks, self.stages, attempt, stage, list(gathered), self.averager)
            except RoundAborted as e:
                return contributors, cohorts, joined, str(e)
            if group.level == len(attempt.tree):
                break  # the top: every member holds the same bytes and computes the final vector itself
            servers = sorted(p for p, r in gathered.items() if not r.get("client", False))
            head = (servers or sorted(gathered))[0]
            joined.append(JoinedGroup(group, len(gathered), head))
            if head != me:
                break  # the head carries this group's result on and brings the final one back
        return contributors, cohorts, joined, None

    def _short_of_quorum(self, attempt: Attempt, contributors: list[Contributor]) -> str | None:
        """Why the result of ``contributors`` cannot commit (None: it may). Only the peers it reaches
        can hold it, and they are its contributors: if they are no quorum of the roster (less the
        departure notices posted so far, :func:`peer.commit.quorum.members_of`), none will hold it."""
        peers = {c.peer for c in contributors}
        if not attempt.roster or is_quorum(peers, attempt.roster):
            return None
        try:
            members = members_of(self.stages.reports.read(attempt.number), attempt.roster)
        except Exception as e:  # a failed read proves nothing: the result is posted as before
            logger.debug(f"could not read attempt {attempt.number}'s reports: {e}")
            return None
        if is_quorum(peers, members):
            return None
        return f"a result of {len(peers)} peer(s) cannot hold a quorum of the {len(members)} in the roster"

    def _units(self, attempt: Attempt, group: TreeGroup) -> list[tuple[str, ...]]:
        """The roster's peers behind each unit of a cross-cohort group (empty: unknown)."""
        if not attempt.cohort_peers:
            return []
        return [
            tuple(p for rank in unit for p in attempt.cohort_peers[rank])
            for unit in units_of(group, len(attempt.cohort_peers), self.settings.cross_group_size)
        ]

    def wire_bytes(self) -> int:
        """Tensor payload bytes the cross averager sent and received so far (the wide-area traffic)."""
        return sum(self.averager.wire_bytes())
