"""Cohort-first averaging across the swarm: the part of a round that crosses the network.

A peer arrives here with its host's contribution already reduced (its workers summed their gradients
with torch.distributed): ``numerator`` = the sum over its samples of the per-sample gradient, and
``samples``. One round then runs three hivemind stages, each exact and all-or-nothing
(:mod:`hivemind_adapter.allreduce`):

1. **cohort** — the members of a cohort (same host or network: cheap links) average their mean
   gradients (``numerator / samples``) weighted by their samples; every member now holds the
   cohort's sample-weighted mean. Gathered metadata tells each member who is in the group, and the
   cohort leader is the smallest peer id among them.
2. **cross** — only cohort leaders meet, weighted by the samples behind their cohort's mean, so only
   one copy of each cohort's vector crosses the wide-area links. Each leader now holds the mean over
   every contributor and, from the gathered metadata, every contributor's sample count and
   sub-network (what the commit names). With more cohorts than ``cross_group_size``, the leaders climb a
   tree of groups of at most that many instead, and the final vector comes back down the same groups
   (:mod:`peer.cross_tree`).
3. **broadcast** — the leader shares the final vector with its cohort: it steps with weight 1, members
   with weight 0 and zeroed tensors, so what members receive *is* the leader's vector, bit for bit.
   A round of one cohort has no broadcast: every member finishes from the cohort stage's bytes.

Per-cohort combination (model-parallel rounds, ``per_cohort=True``): each cohort trains its own
sub-networks, so the round's update is the *sum over cohorts of each cohort's sample-weighted mean*
(times the round's ``scale``), which is the sandwich-rule gradient of all the cohorts' sub-networks
together. The cohort stage leaves each cohort's mean; the cross stage then averages one mean per
cohort with equal weights. A weight
that a cohort's sub-networks did not touch has a zero gradient there, so that cohort adds nothing to
it: untouched weights are neither diluted by other cohorts' zeros nor zeroed.

Every stage averages per-sample means, never sums that grow with a contributor's samples, so a
robust reducer (``robust``: CenteredClip per part of the all-reduce, :mod:`hivemind_adapter.robust_reduce`)
compares like with like: a minority of contributors sending garbage, a scaled or sign-flipped
gradient or NaN is clipped or dropped, and whom a reducer named is in :attr:`AveragingOutcome.outliers`.

Partial participation: a stage waits for its partners only as long as recent rounds suggest
(:mod:`peer.deadlines`; each stage is one step of :mod:`peer.averaging_stage`), then goes on with
whoever came: a cohort member whose cohort never gathers carries its own contribution to the cross
stage as a cohort of one, a leader whose cross group never forms finishes with its cohort alone, a
group whose all-reduce broke meets again without the member that broke it, and a leader that drops
out of the roster before its broadcast is replaced by the next member (every member holds the
cohort's result after the cohort stage; it carries it across cohorts and broadcasts to the rest). Every group key
carries the start state's digest, so a peer that missed a commit (and holds an older state) never
meets the others until it caught up. Whatever groups formed, the result that commits is the one a
quorum of the roster holds (:mod:`peer.round_commit`): the exact mean over exactly the contributors
it names, bit for bit on every peer that commits it. A peer outside that quorum keeps its previous
values and knows it (its outcome says why).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace

import torch

from hivemind_adapter.allreduce import VerifiedAverager
from hivemind_adapter.averager_process import AveragerGone
from hivemind_adapter.dht import peer_id
from hivemind_adapter.group_keys import DeclarationSigner
from hivemind_adapter.reducer_proof import NoiseMap
from hivemind_adapter.robust_reduce import RobustConfig, without_negative_zeros
from hivemind_adapter.wire_codecs import codec_for, roundtrip
from peer.admission import AdmissionMemory
from peer.averaging_stage import AveragingTimeouts, HeadGone, NoGroup, RoundAborted, StageRunner
from peer.conviction_watch import ConvictionWatch
from peer.cross_tree import DEFAULT_FANOUT, JoinedGroup, TreeGroup, cross_groups, units_of
from peer.deadlines import StageDeadlines
from peer.known_cohort import KnownCohort, new_roll
from peer.round_commit import (
    CommitBoard,
    DHTCommitBoard,
    PostedResult,
    attempt_decided,
    await_attempt_decided,
    await_commit,
    await_partners_checked,
    await_quorum_reports,
    equivocation_in,
    report_state,
    result_holds_quorum,
)
from protocol.averaging_group import averaging_group_id, contributors_root, stage_check_token
from protocol.proof_attestation import Equivocation, proofs_fingerprint
from protocol.records import MAX_PROOFS_POSTED
from supernet.state import digest

logger = logging.getLogger(__name__)

# Parts of 4 MiB instead of hivemind's 512 KiB: 8x fewer messages to serialise and stream per
# all-reduce, which is what dominates on fast links (measured in benchmarks/averaging_bench.py).
PART_SIZE_BYTES = 4 * 2**20
# Robust averaging: hivemind's 512 KiB. hivemind deals whole parts to reducers, so with 4 MiB parts a
# model of a few MiB is reduced by one or two members; a robust centre then rests on one reducer's
# word, and a sender it drops is named by that reducer alone (the aggregator wants two: one reducer
# may lie). Smaller parts spread every tensor over the group.
ROBUST_PART_SIZE_BYTES = 2**19


@dataclass(frozen=True)
class Contributor:
    """One peer whose host contribution is in a round's average, as the round's stages gather it."""

    peer: str
    cohort: str
    samples: int
    state: str  # digest of the state its gradient was computed from
    client: bool  # a client-mode peer: it cannot serve, so it never leads its cohort

    def to_wire(self) -> dict:
        """What travels in hivemind's gathered metadata (msgpack: plain types only)."""
        return {"peer": self.peer, "cohort": self.cohort, "samples": self.samples, "state": self.state,
                "client": self.client}  # fmt: skip

    @classmethod
    def from_wire(cls, value: dict) -> Contributor:
        try:
            return cls(str(value["peer"]), str(value["cohort"]), int(value["samples"]), str(value["state"]),
                       bool(value.get("client", False)))  # fmt: skip
        except (KeyError, TypeError, ValueError) as e:
            raise RoundAborted(f"a malformed contributor record: {e}") from None


@dataclass
class AveragingOutcome:
    """What one round of averaging produced, as seen by this peer."""

    committed: bool
    reason: str = ""
    tensors: list[torch.Tensor] | None = None  # the average; None when the round was aborted
    contributors: list[Contributor] = field(default_factory=list)  # sorted by peer id
    cohort_members: list[str] = field(default_factory=list)
    leader: str = ""
    digest: str = ""
    group: str = ""  # the averaging group id of the result (protocol.averaging_group), once it has one
    seconds: dict[str, float] = field(default_factory=dict)  # wall time per stage
    regrouped: list[str] = field(default_factory=list)  # stages whose all-reduce broke and formed again
    known_group: bool = False  # the cohort met as a group known from the roster, without matchmaking
    outliers: list[str] = field(default_factory=list)  # peers this peer's reducers named (robust averaging)
    # the reducers' signed digests of the proofs this peer accepted (protocol.proof_attestation tokens)
    proofs: list[str] = field(default_factory=list)
    # the tokens of the all-reduces of three this peer checked with its partners (round_commit.PostedChecks)
    checked: list[str] = field(default_factory=list)
    # The result this peer posted but saw no quorum for within its commit wait (None otherwise): if
    # the others' reports make one after all, it commits late (committed_late).
    pending: list[torch.Tensor] | None = None

    def posted(self) -> PostedResult:
        """What this peer's report of the result carries (and its state report again)."""
        return PostedResult(
            self.digest, self.group, tuple(self.outliers), tuple(self.proofs), tuple(self.checked)
        )


def committed_late(
    outcome: AveragingOutcome,
    reports: dict[str, dict],
    roster: Collection[str],
    public_keys: Mapping[str, str] | None = None,
) -> AveragingOutcome:
    """``outcome`` committed, if the result it gave up on holds a quorum in ``reports`` after all.

    A peer that posted its result waits a bounded time for a quorum; a peer that posts the same
    result later (a cohort head whose broadcast outlasted the others' commit wait) then sees the
    quorum and commits, while the first gave up and kept its old state. Once the attempt settled, the
    one that gave up checks again: the same rule as a commit, only later, so both hold one state.
    Before, it found no quorum of holders of the new state to catch up with and fell behind the swarm
    for up to 95 s (4-peer churn benchmark). Not where the reports show a reducer's equivocation
    (:func:`~peer.round_commit.equivocation_in`, signatures under ``public_keys``)."""
    if (
        outcome.committed
        or outcome.pending is None
        or not result_holds_quorum(reports, roster, outcome.digest)
        or equivocation_in(reports, public_keys) is not None
    ):
        return outcome
    return replace(outcome, committed=True, reason="", tensors=outcome.pending, pending=None)


def _leader_of(members: Sequence[Contributor], servers_only: bool = False) -> str | None:
    """The member that leads a cohort: the first that can serve others (client-mode peers cannot reduce
    or lead), or with none of those the first of all unless ``servers_only`` (None: no member)."""
    servers = [m.peer for m in members if not m.client]
    if servers or servers_only:
        return servers[0] if servers else None
    return members[0].peer if members else None


def _cohort_tag(cohort: str) -> str:
    # hivemind prefixes may not contain '.', and peers must agree on the tag: hash the cohort name.
    return hashlib.sha256(cohort.encode()).hexdigest()[:16]


# How long a reducer whose replies this peer refused stays out of its groups: long enough that the
# rounds go on without it, short enough that a peer refused by mistake comes back.
BAR_SECONDS = 600.0
# A reducer of a cross stage refused only for its own part's place (reducer_proof.OwnPartDoubt) may
# be an honest head carrying its cohort's bent result: it is barred this long, doubled each time it
# is refused again, up to BAR_SECONDS. About two attempts on the emulated internet, where a full
# bar of an honest head in a pair of heads left the two sites without a quorum for 10 minutes
# (benchmarks/README.md at 7085eb3).
FIRST_OWN_PART_BAR_SECONDS = 60.0


class HierarchicalAverager:
    """Averages one list of tensors per round: cohort, then across cohorts, then back to every member.

    ``template`` gives the shapes and dtypes; all peers of a run must use the same. ``per_cohort``
    selects the model-parallel combination (see the module docstring); without it the result is the
    sample-weighted mean over every contributor (data-parallel rounds). ``pairs_held_to_cohort_noise``:
    in a cross stage of two heads each holds the other's proof to the sampling noise its own cohort
    stage of the same attempt measured (:func:`hivemind_adapter.reducer_proof.pair_ratio`; only
    where both stages average the round's per-sample means, as a round's averager does). ``averager_type`` builds the
    two hivemind averagers (a subclass that fails on purpose is how tests kill a peer at an exact
    point of a stage).
    """

    def __init__(
        self,
        dht,
        run_id: str,
        cohort: str,
        template: Sequence[torch.Tensor],
        *,
        per_cohort: bool = False,
        pairs_held_to_cohort_noise: bool = False,
        cross_codec: str = "none",
        cross_group_size: int = DEFAULT_FANOUT,
        timeouts: AveragingTimeouts = AveragingTimeouts(),
        client_mode: bool = False,
        serves_cohort: bool = False,
        commit_board: CommitBoard | None = None,
        leaving: Callable[[], bool] = lambda: False,
        averager_type: type[VerifiedAverager] = VerifiedAverager,
        deadlines: StageDeadlines | None = None,
        online: Callable[[], Collection[str]] | None = None,
        robust: RobustConfig | None = None,
        declarations: DeclarationSigner | None = None,
        admitted: Callable[[], Mapping[str, str]] | None = None,
        convictions: ConvictionWatch | None = None,
    ):
        self.dht, self.run_id, self.cohort, self.timeouts = dht, run_id, cohort, timeouts
        # reducers convicted of equivocation, here or by anyone (never met again), and where this
        # averager's reports are read again later and its own evidence posted
        self.convictions = convictions
        self.per_cohort = per_cohort
        # the cross stage's parts are the round's per-sample means, like the cohort stage's: a pair's
        # reducer there is held to the noise measured in the cohort stage (see _across_cohorts)
        self.pairs_held_to_cohort_noise = pairs_held_to_cohort_noise and not per_cohort
        self._cohort_noise: tuple[int, NoiseMap] | None = None  # (attempt, what its cohort stage measured)
        # how vectors cross between cohorts: one of wire_codecs.CODECS ("fp16" halves the rounds' traffic)
        self.cross_codec = cross_codec
        self.cross_group_size = cross_group_size
        self.client_mode = client_mode
        # A client-mode peer whose cohort is its own host or LAN serves that cohort (its mates reach
        # its LAN address, peer.affinity.cohort_on_lan); across cohorts it stays a client.
        self.cohort_client_mode = client_mode and not serves_cohort
        self.peer_id = peer_id(dht)
        self.board = commit_board or DHTCommitBoard(dht, run_id, ttl=max(60.0, 3 * timeouts.commit))
        # A peer that changes cohort keeps what its stages took so far (``deadlines``): the same machine
        # and links, where starting over waited the initial deadline for a partner that never came.
        self.deadlines = deadlines or StageDeadlines(timeouts.matchmaking, timeouts.step)
        # The peers in the roster now (None: not known here): one whose announcement expired died or
        # lost its link, and will neither lead a broadcast nor report a result.
        self.online = online
        # contiguous (hivemind flattens with .view(-1)), whatever the template's memory format
        self._buffer = [torch.zeros(t.shape, dtype=t.dtype) for t in template]
        # Matchmaking declares signed and meets only peers the roster pairs with their keys
        # (hivemind_adapter.group_keys): what is admitted is re-read at each attempt.
        self.admitted = admitted
        self._admission = AdmissionMemory()
        common = dict(
            min_group_size=2,
            min_matchmaking_time=timeouts.matchmaking,
            request_timeout=timeouts.request,
            next_chunk_timeout=timeouts.next_chunk,
            allreduce_timeout=timeouts.allreduce,
            allow_state_sharing=False,
            start=True,
        )
        if declarations is not None:
            common["declarations"] = declarations
        # Both averagers run on the same shared-memory buffer; their steps are strictly sequential.
        # The cohort's ends with the roll of sample counts that a known group carries (peer.known_cohort),
        # one slot per member: robust reducers take each slot's owner's value there.
        # ``robust``: reducers take CenteredClip over the senders' parts (hivemind_adapter.robust_reduce).
        self.robust = robust
        self._cohort = averager_type(
            [*self._buffer, new_roll()],
            dht,
            prefix=f"{run_id}_cohort_{_cohort_tag(cohort)}",
            robust=robust,
            slotted_tail=1,
            part_size_bytes=PART_SIZE_BYTES if robust is None else ROBUST_PART_SIZE_BYTES,
            client_mode=self.cohort_client_mode,
            **common,
        )
        self._known = KnownCohort(run_id, cohort, self.cohort_client_mode)
        self._cross_compression = codec_for(self.cross_codec)
        self._cross = averager_type(
            self._buffer,
            dht,
            prefix=f"{run_id}_cross",
            compression=self._cross_compression,
            # model-parallel: each cohort's mean is of its own sub-networks, so the parts differ by design
            robust=replace(robust, like_parts=False) if robust is not None and per_cohort else robust,
            part_size_bytes=PART_SIZE_BYTES if robust is None else ROBUST_PART_SIZE_BYTES,
            client_mode=client_mode,
            **common,
        )
        # Ctrl-C: the round goes on while its group forms or runs, but a peer that is leaving does not
        # wait out the whole deadline for partners who are not there (they left before it).
        self._stages = StageRunner(self.deadlines, self.board, timeouts, leaving, online)
        self._stages.on_broken = self._post_refusals
        self._stages.barred = self._admission.barred
        self._levels = 1  # the cross-cohort tree's depth in the attempt under way (it sets its deadlines)
        self._broadcasts_taken = 0  # broadcast stages this peer took part in, this attempt
        self._waited_out_commit: int | None = None  # the last attempt whose commit wait ran out here
        self._cohort_peers: list[tuple[str, ...]] = []  # the roster's peers of each cohort, this attempt
        self._previous_attempt: int | None = None  # the last attempt this averager took part in
        # (attempt, its roster) when every roster peer had posted for that attempt by this peer's commit
        self.everyone_posted: tuple[int, frozenset[str]] | None = None
        self._named: set[str] = set()  # peers this peer's reducers named outliers, this attempt
        # reducer -> the attempt in which this peer refused its averages (and barred it): see _excuse
        self._refused_in: dict[str, int | None] = {}
        self._convicted_seen = 0  # how many convicted keys _admit has barred so far
        self._attested: dict[str, None] = {}  # this attempt's proof attestations (tokens, in order)
        self._checked: list[str] = []  # this attempt's checked groups of three (_check_with_partners)
        self._check_seconds = 0.0  # spent waiting for partners' checks this attempt

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
        """Average one round's host contributions. ``attempt`` (not the training round: a retried
        round gets a new attempt) is what peers meet on; every participant passes the same value and
        never reuses it. ``numerator`` is this host's sum of per-sample gradients (``samples`` of them);
        ``cohort_size`` and ``num_cohorts`` are the sizes the DHT roster expects (groups form as soon as
        they are full, else after the matchmaking time), ``cohort_rank`` this cohort's place among them
        (which cross-cohort groups its leader meets, :mod:`peer.cross_tree`). ``scale`` multiplies a per-cohort result
        (see :func:`supernet.training.cohort_configs`); every peer must pass the same value.

        ``expected_peers`` is this peer's roster: the result commits once a quorum of it holds the
        same digest (see :mod:`peer.round_commit`). ``cohorts``: the roster's peers of each cohort, by
        rank (empty: unknown); a stage stops waiting for members whose peers all posted a departure
        notice for the attempt (:class:`~peer.averaging_stage.StageRunner`).
        Only peers that started from ``state_digest`` meet. ``superseded`` tells a peer still looking
        for a group that the swarm has moved on to a later round (it then gives up at once). Never raises for network failures: a
        failed round comes back with ``committed=False`` and the reason.

        With one cohort, every member computes the final vector from the cohort stage's result itself
        (the exact all-reduce left the same bytes in every member, and the final vector is a
        deterministic function of them and the gathered sample counts), so the cohort needs no
        broadcast: one all-reduce and its matchmaking fewer (a single-cohort round on 127.0.0.1 spent
        about a third of its time in that broadcast). ``known_group`` (an outer task's inner step):
        the cohort's members, known from the roster, meet without matchmaking
        (:mod:`peer.known_cohort`).
        """
        member_finishes = num_cohorts == 1
        known_group = known_group and member_finishes
        me = Contributor(self.peer_id, self.cohort, int(samples), state_digest, self.client_mode)
        outcome = AveragingOutcome(committed=False)
        self._stages.begin_attempt(superseded)
        t_start = time.perf_counter()
        final: list[torch.Tensor] | None = None
        stage = ("cohort", t_start)  # the stage in progress: a failure's time is charged to it
        # the cross-cohort groups this cohort's leader meets; members wait for its whole climb and back
        tree = cross_groups(cohort_rank, num_cohorts, self.cross_group_size) if num_cohorts > 1 else []
        self._levels = max(1, len(tree))
        self._broadcasts_taken = 0
        self._cohort_peers = [tuple(c) for c in cohorts] if len(cohorts) == num_cohorts else []
        live = self._live_peers(inner_step=known_group) if self._cohort_peers else None
        self._previous_attempt = attempt
        self._take_named()  # what came after the last attempt's end is not this attempt's
        self._named, self._attested = set(), {}
        self._checked, self._check_seconds = [], 0.0
        self._admit()
        try:
            with self._cohort.get_tensors() as buf:
                for b, t in zip(buf, numerator):
                    b.copy_(t)
            if self.robust is not None:  # every stage averages means weighted by samples (_to_own_mean)
                self._to_own_mean(me.samples)
            members = [me]
            known = (
                self._known.members(
                    self._cohort_peers[cohort_rank], cohort_size, self.peer_id, live, self._admission.barred()
                )
                if known_group and self._cohort_peers
                else None
            )
            counts = (
                self._known.average(
                    self._cohort,
                    attempt,
                    known,
                    self.peer_id,
                    me.samples,
                    state_digest,
                    arrival_timeout=self.timeouts.next_chunk,  # hivemind's sender timeout: no longer
                    allreduce_timeout=self.deadlines.allreduce_bound(
                        "cohort", self.timeouts.allreduce, least=2.0 * self.timeouts.next_chunk
                    ),
                    # robust: a weighted centre of the members' means, as in a matchmade stage
                    weight=1.0 if self.robust is None else float(me.samples),
                )  # fmt: skip
                if known is not None
                else None
            )
            if counts is not None:
                members = [Contributor(p, self.cohort, n, state_digest, False) for p, n in zip(known, counts)]
                outcome.known_group = True
                self._check_with_partners(attempt, "cohort", known, self._cohort)
                if self.robust is None:
                    self._to_cohort_mean(members)
            elif self.robust is None:
                self._to_own_mean(me.samples)
            else:  # the buffer holds this peer's mean already; a failed known group left its count
                self._clear_roll()
            if counts is None and cohort_size > 1:
                try:
                    units = [(p,) for p in self._cohort_peers[cohort_rank]] if self._cohort_peers else []
                    gathered = self._stages.run(
                        self._cohort, "cohort", attempt, 0, cohort_size, state_digest, units=units,
                        live=live, weight=float(me.samples), gather=me.to_wire(),
                    )  # fmt: skip
                    members = sorted(
                        (Contributor.from_wire(m) for m in gathered.values()), key=lambda c: c.peer
                    )
                    self._check_with_partners(attempt, "cohort", list(gathered), self._cohort)
                except NoGroup as e:
                    logger.info(f"attempt {attempt}: {e}; this peer goes on as a cohort of one")
            outcome.seconds["cohort"] = time.perf_counter() - t_start
            if (noise := self._cohort.take_measured_noise()) is not None:
                self._cohort_noise = (attempt, noise)
            outcome.cohort_members = [m.peer for m in members]
            # The leader must be able to serve others (client-mode peers cannot reduce or lead).
            outcome.leader = _leader_of(members)
            # A member keeps what the cohort stage left (the broadcast overwrites it): if the leader
            # dies before its broadcast, the next member carries the cohort's result on in its place.
            # (Not a member its cohort cannot reach: it could not broadcast.)
            takes_over = (
                len(members) > 1
                and outcome.leader != self.peer_id
                and not self.cohort_client_mode
                and not member_finishes
            )
            cohort_result = self._snapshot() if takes_over else None
            # the broadcast's group: the members, less leaders that died (none: each member finishes)
            receivers = [me] if member_finishes else list(members)
            self._broadcasts_taken = self._levels if member_finishes else 0  # no broadcast to wait out
            while True:
                i_lead = outcome.leader == self.peer_id or member_finishes
                lead_abort = None
                if i_lead:
                    if cohort_result is not None:
                        self._restore(cohort_result)  # taking over: the cohort's result, not zeros
                    t0 = time.perf_counter()
                    stage = ("cross", t0)
                    final, outcome.contributors, lead_abort = self._across_cohorts(
                        attempt, members, tree, state_digest, scale, live
                    )
                    if lead_abort is not None and len(receivers) == 1:
                        raise RoundAborted(lead_abort)
                    outcome.seconds["cross"] = time.perf_counter() - t0
                if len(receivers) > 1:
                    t0 = time.perf_counter()
                    stage = ("broadcast", t0)
                    try:
                        final, lead_report = self._broadcast(
                            self._cohort, "cohort", attempt, len(receivers), outcome.leader, final,
                            outcome.contributors, lead_abort, state_digest, patience=max(1, len(tree)),
                        )  # fmt: skip
                    except HeadGone as e:
                        receivers = [m for m in receivers if m.peer != outcome.leader]
                        successor = _leader_of(receivers, servers_only=True)
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
                    if lead_abort is not None:
                        raise RoundAborted(lead_abort)
                    if not i_lead:
                        outcome.contributors = [Contributor.from_wire(c) for c in lead_report["contributors"]]
                        self._check_contributors(outcome.contributors, state_digest)
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

        self._take_named()
        outcome.outliers = sorted(self._named)
        outcome.proofs = list(self._attested)[:MAX_PROOFS_POSTED]
        outcome.checked = list(self._checked)
        if self._check_seconds:
            outcome.seconds["check"] = self._check_seconds
        if outcome.outliers:
            logger.warning(
                f"attempt {attempt}: values of {', '.join(p[-8:] for p in outcome.outliers)} were outliers"
            )
        t0 = time.perf_counter()
        committed, reason = self._commit(attempt, outcome, set(expected_peers) | {self.peer_id}, state_digest)
        outcome.seconds["commit"] = time.perf_counter() - t0
        outcome.seconds["total"] = time.perf_counter() - t_start
        outcome.regrouped = list(self._stages.regrouped)
        if committed and final is not None:
            outcome.committed, outcome.tensors = True, final  # fresh tensors, not views of the shared buffer
        else:
            if final is not None and not outcome.reason:  # posted as a result: it may still commit late
                outcome.pending = final
            outcome.reason = outcome.reason or reason
            logger.warning(
                f"attempt {attempt}: averaging aborted, keeping previous values ({outcome.reason})"
            )
        return outcome

    def _check_with_partners(
        self,
        attempt: int,
        stage: str,
        peers: Sequence[str],
        averager: VerifiedAverager,
    ) -> None:
        """After a robust all-reduce of exactly three: go on only once both partners say they received
        and checked the same result (:func:`peer.round_commit.await_partners_checked`, which says why
        groups of three need it). Posts this peer's marker, listing every group it checked in this
        attempt, and waits for theirs; raises :class:`RoundAborted` if they do not confirm. Groups of
        four or more hold a hidden lie by point 6 of the proof; pairs are not covered (README)."""
        if self.robust is None or len(set(peers)) != 3 or self.peer_id not in peers:
            return
        t0 = time.perf_counter()
        with averager.get_tensors() as buf:
            received = digest(list(buf))
        token = stage_check_token(self.run_id, attempt, stage, peers, received)
        self._checked.append(token)
        self._post_marker(attempt)
        partners = sorted(set(peers) - {self.peer_id})
        bound = (
            self.deadlines.allreduce_bound(
                stage.partition("/")[0], self.timeouts.allreduce, least=2.0 * self.timeouts.next_chunk
            )
            + self._commit_wait()
        )
        checked = await_partners_checked(
            self.board, attempt, token, partners, bound,
            never=lambda: self._never_reporting(attempt, partners), public_keys=self.public_keys(),
        )  # fmt: skip
        self._check_seconds += time.perf_counter() - t0
        if checked.equivocation is not None:
            self._convict(attempt, checked.equivocation)
        if not checked.confirmed:
            raise RoundAborted(f"{stage} group of three not confirmed: {checked.reason}")

    def _post_marker(self, attempt: int, *, taken: bool = False) -> None:
        """Post this peer's marker for ``attempt``: the groups of three it checked, the proof
        attestations it accepted and the reducers whose averages it refused, so far (``taken``: the
        caller collected them from the averagers just now, a round of calls to their processes)."""
        if not taken:
            self._take_named()  # the stages' attestations and refusals up to now
        proofs = list(self._attested)[:MAX_PROOFS_POSTED]
        refused = sorted(p for p, at in self._refused_in.items() if at == attempt)
        self.board.post(
            attempt, False, "", wait=False, proofs=proofs, checked=self._checked, checking=True, refused=refused
        )  # fmt: skip

    def _post_refusals(self) -> None:
        """A stage's all-reduce broke: if this peer refused a reducer's averages there, say so in its
        marker now. The partners of that group wait for its confirmation, which will never come; they
        used to wait until this peer had looked for a new group and reported (20 s in a test). Only in
        robust averaging, where refusals and checks happen."""
        attempt = self._previous_attempt
        if self.robust is None or attempt is None:
            return
        self._take_named()
        if any(at == attempt for at in self._refused_in.values()):
            try:
                self._post_marker(attempt, taken=True)
            except Exception as e:  # the DHT may fail a store: the partners then wait as before
                logger.debug(f"could not post this peer's refusals: {e}")

    def _noise_for(self, attempt: int) -> NoiseMap | None:
        """What a pair of heads' reducer is held to in ``attempt``: the sampling noise along the vector
        that this attempt's own cohort stage measured (three parts or more), if this averager holds
        pairs to it. Never an earlier attempt's: each round trains other sub-networks, so where the
        gradient is noisy moves from round to round (measured on the emulated internet: maps one or
        two rounds old put honest pairs at 10-44 times the bound's unit, and they refused each other)."""
        if not self.pairs_held_to_cohort_noise or self._cohort_noise is None:
            return None
        measured, noise = self._cohort_noise
        return noise if measured == attempt else None

    def _live_peers(self, inner_step: bool = False) -> set[str] | None:
        """The peers that posted anything (a result, a failure, a departure notice) for this averager's
        previous attempt: the ones that showed life lately (None: no previous attempt, or nothing
        posted in it seen). An inner step whose previous attempt every roster peer took part in
        knows them without a read (newcomers' departure notices do not matter inside a cohort that
        is about to meet as the roster says)."""
        if self._previous_attempt is None:
            return None
        if (
            inner_step
            and self.everyone_posted is not None
            and self.everyone_posted[0] == self._previous_attempt
        ):
            return set(self.everyone_posted[1])
        try:
            reported = set(self.board.read(self._previous_attempt))
        except Exception as e:  # the DHT may fail a read; then every member is waited for
            logger.debug(f"could not read attempt {self._previous_attempt}'s reports: {e}")
            return None
        return (reported | {self.peer_id}) if reported else None

    def _across_cohorts(
        self,
        attempt: int,
        members: list[Contributor],
        tree: list[TreeGroup],
        state_digest: str,
        scale: float,
        live: set[str] | None = None,
    ) -> tuple[list[torch.Tensor] | None, list[Contributor], str | None]:
        """Leader: up the cross-cohort tree (:mod:`peer.cross_tree`) and back down. Returns the final
        vector (None if aborted), its contributors and the reason it aborted (None if it did not). A
        group that never forms leaves the result below it standing alone at that level; an abort on
        the way travels down with the result's place, so every group below learns it at once."""
        # Both averagers share one buffer: without a cross stage the cohort's result is already where
        # _finish_average reads it.
        # A cross stage of two heads is a pair, whose reducer has no others' spread to be held to:
        # each head holds it to the sampling noise its own cohort stage measured, where the parts of
        # both stages are the round's per-sample means (not in outer exchanges)
        self._cross.set_noise_reference(self._noise_for(attempt))
        contributors, cohorts, joined, abort = self._climb(attempt, members, tree, state_digest, live)
        final = None
        if abort is None and (not joined or joined[-1].head == self.peer_id):
            try:  # this peer carried the result as far as it went: it computes the final vector
                self._check_contributors(contributors, state_digest)
                final = self._finish_average(contributors, len(cohorts), scale)
                if self.cross_codec != "none" and len(tree) > 1:
                    # The way down crosses the same lossy wires: values already in the codec's form
                    # cross them unchanged (every codec is idempotent), so every leader ends with the
                    # bytes whose digest the heads announce.
                    final = [roundtrip(self._cross_compression, t) for t in final]
                # and as every reducer of a broadcast gives them back (no -0.0, which a codec can
                # also make of a tiny negative value): the digest it announces is what members receive
                final = without_negative_zeros(final)
            except RoundAborted as e:
                abort = str(e)
        for step in reversed(joined):
            i_head = step.head == self.peer_id
            try:
                received, report = self._broadcast(
                    self._cross, "cross", attempt, step.participants, step.head, final, contributors, abort,
                    state_digest, level=step.group.level, group=step.group.index, patience=len(tree),
                    what="cross-cohort head",
                )  # fmt: skip
                if not i_head:
                    contributors = [Contributor.from_wire(c) for c in report["contributors"]]
                    self._check_contributors(contributors, state_digest)
                    final = received
            except RoundAborted as e:
                if not i_head:  # the groups this peer leads below learn it on the way down
                    final, abort = None, str(e)
                elif abort is None:  # a head keeps its result; the members that missed it know it
                    logger.info(f"attempt {attempt}: level {step.group.level} broadcast: {e}")
        return final, contributors, abort

    def _climb(
        self,
        attempt: int,
        members: list[Contributor],
        tree: list[TreeGroup],
        state_digest: str,
        live: set[str] | None = None,
    ) -> tuple[list[Contributor], list[str], list[JoinedGroup], str | None]:
        """Leader: average this cohort's result up the tree as long as this peer is the head of what it
        carries. Returns the contributors and cohorts now in the buffer, the groups below the top that it
        met (the last one's head goes on if it is not this peer) and the reason the climb broke (None if
        it did not)."""
        contributors = sorted(members, key=lambda c: c.peer)
        cohorts = [self.cohort]
        joined: list[JoinedGroup] = []
        for group in tree:
            if group.size <= 1:
                continue  # the only unit of its group: nothing to average at this level
            # weights: the samples behind the mean in the buffer, or cohorts (a sum of cohort means)
            weight = float(len(cohorts) if self.per_cohort else sum(c.samples for c in contributors))
            report = {
                "cohorts": cohorts,
                "members": [c.to_wire() for c in contributors],
                "client": self.client_mode,
            }
            try:
                gathered = self._stages.run(
                    self._cross, "cross", attempt, 0, group.size, state_digest, level=group.level,
                    group=group.index, patience=group.level, units=self._units(group), live=live,
                    weight=weight, gather=report,
                )  # fmt: skip
            except NoGroup as e:
                logger.info(f"attempt {attempt}: {e}; level {group.level} goes on with what it has")
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
                # A peer whose all-reduce broke only for itself went on alone, while the group it
                # left holds its contribution: counted twice, the mean would not be over its names.
                return contributors, cohorts, joined, "a contributor reached the cross stage twice"
            if self.per_cohort and len(set(cohorts)) != len(cohorts):
                # A cohort that split (one part missed the other) would count its sub-networks twice.
                return contributors, cohorts, joined, "a cohort reached the cross stage in two parts"
            try:
                self._check_with_partners(
                    attempt, f"cross/{group.level}/{group.index}", list(gathered), self._cross
                )
            except RoundAborted as e:
                return contributors, cohorts, joined, str(e)
            if group.level == len(tree):
                break  # the top: every member holds the same bytes and computes the final vector itself
            servers = sorted(p for p, r in gathered.items() if not r.get("client", False))
            head = (servers or sorted(gathered))[0]
            joined.append(JoinedGroup(group, len(gathered), head))
            if head != self.peer_id:
                break  # the head carries this group's result on and brings the final one back
        return contributors, cohorts, joined, None

    def _admit(self) -> None:
        """Tell both averagers' matchmaking which peers it may meet in this attempt."""
        if self.admitted is None:
            return
        if self.convictions is not None:
            convicted = self.convictions.convicted_keys()
            for key in convicted:
                self._admission.bar_key(key)
            if len(convicted) > self._convicted_seen:  # a lie just came to light: see _excuse
                self._convicted_seen = len(convicted)
                self._excuse(self._previous_attempt, "a reducer of the swarm was convicted of equivocation")
        try:
            read = dict(self.admitted())
        except Exception as e:  # a failed read admits no one new and bars no one
            logger.debug(f"could not read the roster to admit peers: {e}")
            return
        peers = self._admission.update(read, self.peer_id)
        if peers is not None:
            for averager in (self._cohort, self._cross):
                averager.set_admitted(peers)

    def _take_named(self) -> None:
        """Collect whom this attempt's all-reduces named (robust averaging), the stages that failed
        included: a reducer whose replies this peer refused fails the stage, and is named for that.
        Such a reducer is also barred from this peer's groups (:meth:`_caught`), or the stage would
        form again around it (a dishonest peer that bars honest ones isolates only itself)."""
        for averager in (self._cohort, self._cross):
            self._named.update(averager.take_named())
            self._attested.update((a.to_token(), None) for a in averager.take_attestations())
            for refused in averager.take_refused():
                # across cohorts a head's own part is its cohort's result, which a liar in its cohort
                # may have bent; in its cohort stage a reducer's own part is its own work
                if refused.for_its_own_part and averager is self._cross:
                    self._caught(
                        refused.peer, "its own part lay far beyond the others'", for_its_own_part=True
                    )
                else:
                    self._caught(refused.peer, "this peer refused its averages as implausible")
                self._refused_in[refused.peer] = self._previous_attempt

    def public_keys(self) -> dict[str, str] | None:
        """The roster's keys (peer id -> hex) whose signatures count here; None in a swarm without
        MANTA keys (its peers trust each other)."""
        return None if self.admitted is None else self._admission.keys()

    def _caught(self, peer: str, why: str, *, for_its_own_part: bool = False) -> None:
        """``peer`` sent this peer results it cannot have computed honestly: name it in this attempt's
        commit and bar it from this peer's groups for :data:`BAR_SECONDS`. ``for_its_own_part``: a
        head of whose averages only its own part was implausible, which its cohort's liar may have
        made so; barred for :data:`FIRST_OWN_PART_BAR_SECONDS`, doubled each time again."""
        self._named.add(peer)
        already = peer in self._admission.barred()
        if for_its_own_part:
            seconds = self._admission.bar_again(peer, FIRST_OWN_PART_BAR_SECONDS, BAR_SECONDS)
        else:
            seconds = BAR_SECONDS
            self._admission.bar(peer, seconds)
        if not already:
            logger.warning(f"{peer[-8:]} barred for {seconds:.0f} s: {why}")

    def barred_for(self) -> dict[str, float]:
        """The peers this peer now bars from its groups, with the seconds left (a convicted key's:
        infinity)."""
        return self._admission.barred_for()

    def _excuse(self, attempt: int | None, why: str, liar: str | None = None) -> None:
        """Lift the bars this peer placed in ``attempt`` (or the one before) on reducers whose averages
        it refused: a reducer convicted of equivocation in the same attempt explains them. An honest
        cohort head that carried the lie into the cross stage had its averages refused there, and,
        barred for 10 minutes by the other site's head, kept the two sites from ever meeting again:
        no quorum (measured on the emulated internet: the swarm stalled on round 1). A reducer that
        really lied is refused, and barred, again in its next attempt."""
        if attempt is None:
            return
        recent = [
            p
            for p, at in self._refused_in.items()
            if p != liar and at is not None and attempt - 1 <= at <= attempt
        ]
        for peer in recent:
            del self._refused_in[peer]
            self._admission.unbar(peer)
            logger.warning(
                f"{peer[-8:]} no longer barred: {why}, which its refused averages may have carried"
            )

    def _snapshot(self) -> list[torch.Tensor]:
        with self._cohort.get_tensors() as buf:
            return [b.clone() for b in buf[: len(self._buffer)]]  # not the roll

    def _restore(self, tensors: Sequence[torch.Tensor]) -> None:
        with self._cohort.get_tensors() as buf:
            for b, t in zip(buf, tensors):
                b.copy_(t)

    def _units(self, group: TreeGroup) -> list[tuple[str, ...]]:
        """The roster's peers behind each unit of a cross-cohort group (empty: unknown)."""
        if not self._cohort_peers:
            return []
        return [
            tuple(p for rank in unit for p in self._cohort_peers[rank])
            for unit in units_of(group, len(self._cohort_peers), self.cross_group_size)
        ]

    @staticmethod
    def _check_contributors(contributors: list[Contributor], state_digest: str) -> None:
        states = {c.state for c in contributors}
        if len(states) > 1:
            raise RoundAborted(f"contributors started from {len(states)} different states")
        if state_digest and states != {state_digest}:
            raise RoundAborted("contributors started from another state than this peer")

    def _to_cohort_mean(self, members: list[Contributor]) -> None:
        """A plain known group's average left ``sum of numerators / n_members`` (it weighs members
        equally, to carry their counts in the roll); make it the cohort's sample-weighted mean (zeros
        if the cohort processed no samples), what the other stages hold."""
        samples = sum(m.samples for m in members)
        factor = len(members) / samples if samples > 0 else 0.0
        with self._cohort.get_tensors() as buf:
            for b in buf[: len(self._buffer)]:
                b.mul_(factor)

    def _to_own_mean(self, samples: int) -> None:
        """The buffer's numerator becomes this peer's mean gradient (zeros without samples), and the
        roll zeros: every stage averages per-sample means weighted by the samples behind them, so that
        a robust reducer compares like with like (a numerator grows with its samples, a mean does
        not) and no leftover count in the roll reads as an outlier."""
        factor = 1.0 / samples if samples > 0 else 0.0
        with self._cohort.get_tensors() as buf:
            for b in buf[: len(self._buffer)]:
                b.mul_(factor)
        self._clear_roll()

    def _clear_roll(self) -> None:
        """Zeros in the roll: a matchmade group's senders are not in a known group's order, so a count
        left in one's slot would sit in another's (and a robust reducer names a sender for that)."""
        with self._cohort.get_tensors() as buf:
            buf[-1].zero_()

    def _finish_average(
        self, contributors: list[Contributor], cohorts: int, scale: float
    ) -> list[torch.Tensor]:
        """Leader: the final vector from the cross-stage result (every leader holds the same bytes, and
        computes the same product from them, so every leader's final vector is bit-identical)."""
        samples = float(sum(c.samples for c in contributors))
        if samples <= 0:
            raise RoundAborted("no samples were contributed")
        with self._cross.get_tensors() as buf:
            if self.per_cohort:  # buf = (sum of cohort means) / cohorts
                return [b * (cohorts * scale) for b in buf]
            return [b.clone() for b in buf]  # buf = the sample-weighted mean over the contributors

    def _broadcast(
        self,
        averager: VerifiedAverager,
        name: str,
        attempt: int,
        size: int,
        head: str,
        final: list[torch.Tensor] | None,
        contributors: list[Contributor],
        abort: str | None,
        state_digest: str,
        *,
        level: int = 0,
        group: int = 0,
        patience: int = 1,
        what: str = "cohort leader",
    ) -> tuple[list[torch.Tensor], dict]:
        """The head's final vector to every member of a group it led, exactly (weights 1 and 0, members
        send zeros). A head that aborted still takes part, with ``ok: False``, so members stop waiting
        at once. Returns what arrived and the head's report; raises if the head aborted.

        A head whose broadcast fails keeps its result: members only follow, so the head reduces every
        part; a member that vanished inside the all-reduce (it breaks it for the head alone) took
        nothing from the others, who received the head's vector whole. The head looks once more, for
        two matchmaking periods, for members its group counted in and never heard from (alive, they
        still look for it); members it never reaches stop looking when it posts its result. Their
        loss costs their vote, not the head's."""
        i_head = head == self.peer_id
        self._broadcasts_taken += 1
        if i_head and final is not None:
            final = without_negative_zeros(final)  # what the reducers give back, byte for byte
        with averager.get_tensors() as buf:
            for i, b in enumerate(buf):
                if i_head and final is not None and i < len(final):  # not the cohort's roll
                    b.copy_(final[i])
                else:
                    b.zero_()  # weight 0 and zeros: what we receive is exactly the head's vector
        report = {"lead": i_head}
        if i_head:
            report.update(
                ok=abort is None and final is not None,
                reason=abort or "",
                contributors=[c.to_wire() for c in contributors],
                digest=digest(final) if final is not None else "",
            )
        try:
            gathered = self._stages.run(
                averager, name, attempt, 1, size, state_digest, level=level, group=group, patience=patience,
                watch="" if i_head else head, weight=1.0 if i_head else 0.0, gather=report,
            )  # fmt: skip
        except RoundAborted as e:
            if not (i_head and report["ok"]):
                raise
            logger.info(
                f"attempt {attempt}: broadcast to the group this peer leads: {e}; it keeps its result"
            )
            return final, report
        lead_reports = [r for r in gathered.values() if r.get("lead")]
        if len(lead_reports) != 1:
            raise RoundAborted(f"broadcast group had {len(lead_reports)} leaders instead of 1")
        if not lead_reports[0].get("ok", False):
            raise RoundAborted(f"the {what} aborted: {lead_reports[0].get('reason', '')}")
        with averager.get_tensors() as buf:
            received = [b.clone() for b in buf[: len(self._buffer)]]  # not the cohort's roll
        if not i_head and digest(received) != lead_reports[0]["digest"]:
            leader = next(p for p, r in gathered.items() if r.get("lead"))
            if leader == head:
                # The head reduced every part of its broadcast alone (members only follow), over exact
                # links: what arrived is what it sent, and not what it announced. It lied.
                self._caught(head, f"its broadcast differs from the digest it announced as {what}")
            raise RoundAborted(f"broadcast result differs from the {what}'s digest")
        return received, lead_reports[0]

    def _commit(
        self, attempt: int, outcome: AveragingOutcome, roster: set[str], state_digest: str
    ) -> tuple[bool, str]:
        """Publish our result's digest; commit once a quorum of the roster holds the same one (a known
        group that is the whole roster confirms it among its members: :mod:`peer.known_cohort`)."""
        ok = not outcome.reason and bool(outcome.digest)
        if ok:
            members = [(c.peer, c.samples) for c in outcome.contributors]
            outcome.group = averaging_group_id(self.run_id, attempt, contributors_root(members), state_digest)
        # Not waiting for the DHT's store: the first reads overlap it (this peer's own report counts
        # once it shows, like everyone else's).
        self.board.post(
            attempt, ok, outcome.digest, wait=False, group=outcome.group, outliers=outcome.outliers,
            proofs=outcome.proofs, checked=outcome.checked,
        )  # fmt: skip
        if not ok:
            return False, outcome.reason
        if roster == {self.peer_id}:
            # A roster of one (a cohort of one in an inner step): its quorum is this peer, and reading
            # its own report back from the DHT only waited for the store to cross the wide area (22 %
            # of an inner step on the "home" profile, where every site is a cohort of one).
            self.everyone_posted = (attempt, frozenset(roster))
            return True, ""
        members = tuple(outcome.cohort_members)
        if outcome.known_group and set(members) == roster:
            bound = self.deadlines.allreduce_bound(
                "cohort", self.timeouts.allreduce, least=2.0 * self.timeouts.next_chunk
            )
            # every member confirms the result and the proofs it took with it (a reducer that
            # equivocated gave members different ones: then the board decides, and shows it)
            confirmed = proofs_fingerprint(outcome.digest, outcome.proofs)
            if self._known.confirm(
                self._cohort, attempt, members, self.peer_id, confirmed, state_digest, bound
            ):
                self.everyone_posted = (attempt, frozenset(roster))  # every member took part, none is past it
                return True, ""
        started = time.monotonic()
        # Peers do not finish together: a cohort of one has no broadcast, the top of the tree is done
        # before the groups below it. Recent commits say how long the others take to post once they
        # are all as far as this peer; it also waits out the broadcasts it had no part in, as long as
        # they may take. (Not the whole attempt's deadlines: a dead peer in the roster, undecided
        # forever, would then hold the survivors in very different waits and out of step.)
        skipped = max(0, self._levels - self._broadcasts_taken) * self.deadlines.deadline("broadcast").seconds
        witnesses = [c.peer for c in outcome.contributors if c.peer != self.peer_id]
        decision = await_commit(
            self.board, attempt, outcome.digest, roster, self._commit_wait() + skipped,
            never=lambda: self._never_reporting(attempt, roster), public_keys=self.public_keys(),
            witnesses=witnesses,
        )  # fmt: skip
        if decision.equivocation is not None:
            self._convict(attempt, decision.equivocation)
        elif self.convictions is not None and set(witnesses) - decision.seen:
            # A contributor had not reported when this peer decided: its story, when it comes (a
            # reducer may have held its results back), is compared later. (With every report in,
            # every story was compared; a known cohort's confirmation compares them all too.)
            self.convictions.recheck_later(self.board, attempt)
        if decision.committed:
            self.deadlines.record("commit", time.monotonic() - started)
        # Who showed life in this attempt, if everyone did: the next attempt needs no read to know.
        self.everyone_posted = (
            (attempt, frozenset(roster)) if roster <= decision.seen | {self.peer_id} else None
        )
        if decision.timed_out:
            self._waited_out_commit = attempt
        return decision.committed, decision.reason

    def _convict(self, attempt: int, equivocation: Equivocation) -> None:
        """A reducer of ``attempt`` signed two different proofs for one all-reduce: bar it here, and
        post the evidence so that every other peer bars it too, once it reads it."""
        liar = equivocation.reducer
        self._caught(liar, equivocation.describe())
        self._excuse(attempt, f"reducer {liar[-8:]} told members different stories", liar)
        if self.convictions is not None:
            self.convictions.report(equivocation)

    def settle(self, attempt: int, roster: Collection[str]) -> bool:
        """After this peer's ``attempt`` failed: wait until the others are done with it too, so that
        the next attempt starts together and the state the others just committed is there to catch up
        with. Done is a quorum of ``roster`` reported (bounded by the attempt's stage deadlines) and
        its outcome is decided: a result holds a quorum, or none can (bounded by how long the others
        wait for their commit: a peer that died in the roster keeps a result that lacks it undecided).
        Returns whether both happened.

        A peer that posted a result and waited out its whole commit wait for this attempt does not
        wait for the outcome a second time: the others that posted a result give up as it did, at
        the same time, while a peer whose round failed before it had a result waited only once. Two
        waits put it a commit wait (6 s) behind that peer: in the test suite's swarm with a silent
        roster peer, the early one's gathering ended before it came, and the next attempt split in
        two. A result whose quorum shows later still commits (:func:`peer.round.commit_pending`)."""
        everyone = set(roster) | {self.peer_id}
        never = functools.partial(self._never_reporting, attempt, everyone)
        if not await_quorum_reports(self.board, attempt, everyone, self.deadlines.total(self._levels), never):
            return False
        if self._waited_out_commit == attempt:
            return attempt_decided(self.board.read(attempt), everyone, never())
        return await_attempt_decided(self.board, attempt, everyone, self._commit_wait(), never)

    def commit_late(
        self, attempt: int, roster: Collection[str], outcome: AveragingOutcome
    ) -> AveragingOutcome:
        """After :meth:`settle`: ``outcome`` committed if its result found a quorum after all
        (:func:`committed_late`); as it was otherwise, or if the board cannot be read."""
        if outcome.committed or outcome.pending is None:
            return outcome
        try:
            reports = self.board.read(attempt)
        except Exception as e:  # the DHT may fail a read; the round stays aborted, catch-up follows
            logger.debug(f"could not read attempt {attempt}'s reports again: {e}")
            return outcome
        late = committed_late(outcome, reports, set(roster) | {self.peer_id}, self.public_keys())
        if late.committed:
            logger.info(
                f"attempt {attempt}: its result reached a quorum after this peer gave up waiting: committed"
            )
        return late

    def _never_reporting(self, attempt: int, roster: Collection[str]) -> set[str]:
        """Roster peers that will not report for ``attempt``: gone from the roster (their
        announcement expired: dead, or cut off). Empty where the roster is not known here."""
        if self.online is None:
            return set()
        try:
            online = set(self.online())
        except Exception as e:  # a failed read proves nothing: wait on as without it
            logger.debug(f"could not tell which peers left attempt {attempt}: {e}")
            return set()
        if self.peer_id not in online:  # an incomplete read (this peer's own announcement is missing)
            return set()
        return set(roster) - online

    def _commit_wait(self) -> float:
        """How long a peer that posted its result waits for a quorum to hold it, by recent commits."""
        return self.deadlines.deadline("commit", ceiling=self.timeouts.commit).seconds

    # ------------------------------------------------------------------ helpers

    def next_attempt(self, after: int, within_cohort: bool = False) -> int:
        """The attempt to use after ``after``: one past the highest anyone posted, so peers whose
        aborts took different times meet again on the same attempt. ``within_cohort`` (an outer
        task's inner steps, which only the cohort takes together): one past the highest this cohort's
        roster peers posted. Cohorts drift apart between outer steps; a member that saw the other
        cohort post its next attempt first, and its partner that did not, met on different attempts
        (measured: the 2-site outer-steps test, once inner steps stopped waiting on matchmaking)."""
        peers = next((c for c in self._cohort_peers if self.peer_id in c), None) if within_cohort else None
        if peers is not None and self.everyone_posted == (after, frozenset(peers) | {self.peer_id}):
            # Every peer of the cohort posted for ``after``, so none is past it: no need to read the
            # board's every bucket across the wide area (0.2-0.6 s per inner step on broadband).
            return after + 1
        return max(after, self.board.latest_attempt(peers)) + 1

    def report_state(self, attempt: int, outcome: AveragingOutcome, state_digest: str) -> None:
        """After committing ``outcome`` of ``attempt``: :func:`peer.round_commit.report_state`."""
        report_state(self.board, attempt, outcome.posted(), state_digest)

    def leave(self, attempt: int) -> None:
        """Tell the swarm this peer will not take part in ``attempt``: its cohort stops waiting for it
        as leader at once, and the commit quorum no longer counts it (:mod:`peer.round_commit`)."""
        try:
            self.board.post(attempt, False, "", left=True)
        except Exception as e:  # the DHT may be unreachable; the others then time out as before
            logger.debug(f"departure notice failed: {e}")

    def cross_cohort_bytes(self) -> int:
        """Tensor payload bytes this peer's cross-cohort all-reduces sent and received so far: what
        this averager moved over the wide-area links (the cohort stage's stay on the cohort's)."""
        return sum(self._cross.wire_bytes())

    def ended(self) -> str | None:
        """Why this averager can no longer average (one of its processes ended: killed, out of memory),
        or None while both run."""
        for averager in (self._cohort, self._cross):
            try:
                averager.check_alive()
            except AveragerGone as e:
                return str(e)
        return None

    def shutdown(self) -> None:
        for averager in (self._cohort, self._cross):
            if averager.is_alive():
                averager.shutdown()
            else:  # ended without a shutdown: what it left in /tmp
                averager.remove_socket_file()
