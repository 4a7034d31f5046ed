"""Where averagers are built: :func:`build_averager` wires one :class:`~.hierarchy.HierarchicalAverager`
from its parts, and :class:`CohortAveragers` keeps a peer's: one for its rounds and, in ``sync =
"outer"`` tasks, one for its outer steps. The two share neither a buffer nor groups (an overlapped
outer exchange runs while the rounds go on), and outer steps are numbered on a board of their own (the
k-th period's end). A peer that changes cohort gets new averagers; its rounds' committer (the attempt
counter) and stage deadlines carry over."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import replace

import torch

from hivemind_adapter.allreduce import VerifiedAverager
from hivemind_adapter.dht import peer_id as dht_peer_id
from hivemind_adapter.group_keys import DeclarationSigner
from hivemind_adapter.wire_codecs import codec_for
from peer.averaging.cross_stage import CrossCohortStage
from peer.averaging.cross_tree import DEFAULT_FANOUT
from peer.averaging.deadlines import StageDeadlines
from peer.averaging.hierarchy import HierarchicalAverager
from peer.averaging.known_cohort import KnownCohort, new_roll
from peer.averaging.settings import AveragerSettings
from peer.averaging.stage import AveragingTimeouts, StageRunner
from peer.commit.boards import CommitBoard, DHTCommitBoard
from peer.commit.certified import CertificateVotes, CertifiedCommitter
from peer.commit.committer import RoundCommitter
from peer.guard.conviction_watch import ConvictionWatch
from peer.guard.partner_checks import PartnerChecks
from peer.guard.peer_guard import PeerGuard
from protocol.task_spec import TaskSpec
from robust_aggregation.centered_clip import RobustConfig

# Parts of 4 MiB instead of hivemind's 512 KiB: 8x fewer messages per all-reduce, which dominates on
# fast links (benchmarks/RESULTS.md, "Averaging: hierarchy against flat hivemind and gloo").
PART_SIZE_BYTES = 4 * 2**20
# Robust averaging keeps hivemind's 512 KiB: whole parts go to reducers, and a robust centre should
# rest on several reducers' word, not one's.
ROBUST_PART_SIZE_BYTES = 2**19


def committer_for(
    board: CommitBoard,
    timeouts: AveragingTimeouts,
    online: Callable[[], Collection[str]] | None = None,
    certificates: CertificateVotes | None = None,
) -> RoundCommitter:
    """A committer on ``board`` with fresh stage deadlines (the averager's stages share them);
    with ``certificates``, certificates decide its rounds."""
    deadlines = StageDeadlines(timeouts.matchmaking, timeouts.step)
    if certificates is not None:
        return CertifiedCommitter(board, deadlines, timeouts.commit, online, certificates)
    return RoundCommitter(board, deadlines, timeouts.commit, online)


def build_averager(
    dht,
    run_id: str,
    cohort: str,
    template: Sequence[torch.Tensor],
    *,
    timeouts: AveragingTimeouts = AveragingTimeouts(),
    per_cohort: bool = False,
    pairs_held_to_cohort_noise: bool = False,
    cross_codec: str = "none",
    cross_group_size: int = DEFAULT_FANOUT,
    client_mode: bool = False,
    serves_cohort: bool = False,
    robust: RobustConfig | None = None,
    committer: RoundCommitter | None = None,
    leaving: Callable[[], bool] = lambda: False,
    online: Callable[[], Collection[str]] | None = None,
    declarations: DeclarationSigner | None = None,
    admitted: Callable[[], Mapping[str, str]] | None = None,
    convictions: ConvictionWatch | None = None,
    averager_type: type[VerifiedAverager] = VerifiedAverager,
) -> HierarchicalAverager:
    """One averager of ``template``'s shapes and dtypes (every peer of a run must use the same), for
    ``cohort`` under ``run_id``: its two hivemind averagers (the cohort's, whose buffer ends with the
    known-group roll, and the cross-cohort one, sharing the same tensors), its guard, partner checks,
    stage runner and cross-cohort stage. The settings are :class:`~.settings.AveragerSettings`'s.

    ``committer``: the committer of the board it posts on (None: a fresh one on an unsigned board,
    for swarms whose peers trust each other); ``leaving``: whether this peer is leaving; ``online``:
    the roster's peers now; ``declarations`` signs matchmaking declarations and ``admitted`` reads
    the roster's peers and keys (None: anyone meets); ``convictions``: reducers convicted of
    equivocation; ``averager_type`` builds the hivemind averagers (tests kill a peer with a subclass).
    """
    peer_id = dht_peer_id(dht)
    settings = AveragerSettings(
        run_id, cohort, peer_id, timeouts, per_cohort, pairs_held_to_cohort_noise, cross_codec,
        cross_group_size, client_mode, serves_cohort, robust,
    )  # fmt: skip
    if committer is None:
        board = DHTCommitBoard(dht, run_id, ttl=max(60.0, 3 * timeouts.commit))
        committer = committer_for(board, timeouts, online)
    buffer = [torch.zeros(t.shape, dtype=t.dtype) for t in template]  # contiguous, whatever the template
    common = dict(
        min_group_size=2,
        min_matchmaking_time=timeouts.matchmaking,
        request_timeout=timeouts.request,
        next_chunk_timeout=timeouts.next_chunk,
        allreduce_timeout=timeouts.allreduce,
        allow_state_sharing=False,
        part_size_bytes=PART_SIZE_BYTES if robust is None else ROBUST_PART_SIZE_BYTES,
        start=True,
    )
    if declarations is not None:
        common["declarations"] = declarations
    # Both run on the same shared-memory buffer; their steps are strictly sequential.
    cohort_averager = averager_type(
        [*buffer, new_roll()], dht, prefix=f"{run_id}_cohort_{cohort_tag(cohort)}", robust=robust, slotted_tail=1,
        client_mode=settings.cohort_client_mode, **common,
    )  # fmt: skip
    cross_averager = averager_type(
        buffer, dht, prefix=f"{run_id}_cross", compression=codec_for(cross_codec),
        # model-parallel: each cohort's mean is of its own sub-networks, so the parts differ by design
        robust=replace(robust, like_parts=False) if robust is not None and per_cohort else robust,
        client_mode=client_mode, **common,
    )  # fmt: skip
    guard = PeerGuard(peer_id, (cohort_averager, cross_averager), admitted, convictions)
    checks = PartnerChecks(run_id, guard, committer, robust is not None)
    stages = StageRunner(
        committer.deadlines, committer.reports, timeouts, leaving, online,
        on_broken=checks.post_refusals, barred=guard.barred, refresh_admission=guard.refresh_admission,
    )  # fmt: skip
    cross = CrossCohortStage(settings, cross_averager, stages, guard, checks, len(buffer))
    known = KnownCohort(run_id, cohort, settings.cohort_client_mode)
    return HierarchicalAverager(settings, cohort_averager, cross, stages, committer, guard, checks, known)


def cohort_tag(cohort: str) -> str:
    """The cohort's part of its averager's prefix: hivemind prefixes may not contain '.', and peers
    must agree on it."""
    return hashlib.sha256(cohort.encode()).hexdigest()[:16]


class CohortAveragers:
    """A peer's averagers for its current cohort (see the module docstring). ``round_commits`` is the
    rounds' committer (its board, deadlines and attempt counter outlive cohort changes);
    ``outer_board`` the outer steps' board (None: not an outer task). ``serves_cohort`` says whether
    a client-mode peer's cohort reaches it on its LAN; ``on_ended`` is told once, why, if a process of
    an averager in use ended."""

    def __init__(
        self,
        dht,
        task: TaskSpec,
        template: Sequence[torch.Tensor],
        *,
        timeouts: AveragingTimeouts,
        client_mode: bool,
        round_commits: RoundCommitter,
        outer_board: CommitBoard | None,
        leaving: Callable[[], bool],
        online: Callable[[], Collection[str]],
        on_new: Callable[[], None] = lambda: None,
        declarations: DeclarationSigner | None = None,
        admitted: Callable[[], Mapping[str, str]] | None = None,
        serves_cohort: Callable[[str], bool] = lambda cohort: False,
        convictions: ConvictionWatch | None = None,
        on_ended: Callable[[str], None] = lambda reason: None,
    ):
        self.dht, self.task, self.template = dht, task, list(template)
        self.round_commits, self.outer_board = round_commits, outer_board
        self.on_new, self.on_ended, self.serves_cohort = on_new, on_ended, serves_cohort
        params = task.params
        # what every averager of this peer shares
        self._common = dict(
            timeouts=timeouts, client_mode=client_mode, cross_group_size=params.cross_group_size,
            leaving=leaving, online=online, declarations=declarations, admitted=admitted,
            convictions=convictions, robust=RobustConfig() if params.robust_averaging else None,
        )  # fmt: skip
        self.current: HierarchicalAverager | None = None  # the rounds' averager
        self.current_outer: HierarchicalAverager | None = None
        self._retired_bytes = 0  # cross-cohort bytes of the averagers shut down so far
        self._ended_told = False

    def rounds(self, cohort: str) -> HierarchicalAverager:
        """The cohort's averager for its rounds."""
        if self.current is not None and self.current.cohort == cohort:
            self._check(self.current)
            return self.current
        if self.current is not None:
            self._retire(self.current)
        self.current = build_averager(
            self.dht, self.task.task_id, cohort, self.template, per_cohort=self.task.mode == "model",
            pairs_held_to_cohort_noise=True, cross_codec="fp16" if self.task.params.cross_cohort_fp16 else "none",
            serves_cohort=self.serves_cohort(cohort), committer=self.round_commits, **self._common,
        )  # fmt: skip
        self.on_new()
        return self.current

    def outer(self, cohort: str) -> HierarchicalAverager:
        """The cohort's averager for its outer exchanges: pseudo-gradients cross cohorts through the
        task's codec; in model-parallel tasks with the touched-weights mask beside them
        (:mod:`peer.outer_round`), so its vector is the parameters' twice."""
        if self.current_outer is not None and self.current_outer.cohort == cohort:
            self._check(self.current_outer)
            return self.current_outer
        if self.current_outer is not None:
            self._retire(self.current_outer)
        template = [*self.template, *self.template] if self.task.mode == "model" else self.template
        committer = committer_for(self.outer_board, self._common["timeouts"], self._common["online"])
        self.current_outer = build_averager(
            self.dht, f"{self.task.task_id}_outer", cohort, template, cross_codec=self.task.params.outer_compression,
            serves_cohort=self.serves_cohort(cohort), committer=committer, **self._common,
        )  # fmt: skip
        self.on_new()
        return self.current_outer

    def cross_cohort_bytes(self) -> int:
        """Payload bytes this peer's all-reduces moved across cohorts since it started."""
        live = sum(a.cross_cohort_bytes() for a in (self.current, self.current_outer) if a is not None)
        return self._retired_bytes + live

    def _check(self, averager: HierarchicalAverager) -> None:
        # An averager whose process ended cannot be replaced on this node (p2pd keeps its handlers):
        # the peer is told once, and stops in one line rather than fail every round.
        reason = averager.ended()
        if reason is not None and not self._ended_told:
            self._ended_told = True
            self.on_ended(reason)

    def _retire(self, averager: HierarchicalAverager) -> None:
        self._retired_bytes += averager.cross_cohort_bytes()
        averager.shutdown()

    def public_keys(self) -> dict[str, str]:
        """The keys (peer id -> hex) the rounds' averager admitted recently: whose signatures count."""
        averager = self.current
        return (averager.public_keys() if averager is not None else None) or {}

    def shutdown(self) -> None:
        for averager in (self.current, self.current_outer):
            if averager is not None:
                try:
                    averager.shutdown()
                except Exception:  # already gone with its process: nothing left to stop
                    pass
