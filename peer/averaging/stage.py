"""One stage of a round's averaging: one hivemind step, bounded by a deadline from recent rounds.

:mod:`peer.averaging.hierarchy` decides which stages a peer takes (its cohort, the cross-cohort tree, the
broadcasts back down) and what travels in them; this module takes one of them. It sets the group
key (attempt, stage, start state, tree group), the group size and whether this peer only follows,
then steps until a group forms and its all-reduce finishes, the stage's deadline passes
(:class:`NoGroup`), or the stage cannot succeed any more (:class:`RoundAborted`: the peer it waits
for reported a failure, the swarm moved on, this peer is leaving, the all-reduce failed).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection, Sequence
from concurrent import futures
from dataclasses import dataclass

from hivemind_adapter.allreduce import (
    AllReduceBroke,
    VerifiedAverager,
    cancel_step,
    looking_for_group,
    member_ids,
)
from hivemind_adapter.dht import dht_time
from peer.averaging.cross_tree import units_for_majority
from peer.averaging.deadlines import StageDeadlines
from peer.commit.boards import ReportSource

logger = logging.getLogger(__name__)

# A leaving peer that knows no partner of a stage (no units, no head to watch) looks for its group this
# many matchmaking periods before it gives up: partners who are there find each other within one.
# One that knows them waits while they can come: stopped together, they are finishing the same round.
LEAVING_GRACE_FACTOR = 3
# A stage's own averaging, and a broadcast's head, wait for the whole group (it begins at once when
# full) up to this many matchmaking periods: a group begun with the early members splits the
# stage's result in two, or leaves a receiver without the broadcast (and its vote).
GATHER_PERIODS = 3.0
# A group of cohort heads below the top waits longer: a unit it starts without loses the attempt
# for all of its peers, and under load units arrive over about 10 s (the top group waits longer still).
QUORUM_GATHER_PERIODS = 6.0
ONLINE_CHECK_SECONDS = 2.0  # how often a broadcast's receiver reads the roster for its sender
# After its all-reduce broke, a group whose result must hold a quorum looks for its survivors this many
# periods from the break, whatever is left of each member's own wait (members began it at different times).
REGROUP_QUORUM_PERIODS = 5.0


@dataclass(frozen=True)
class AveragingTimeouts:
    """Seconds. Every hivemind wait is bounded: a dead peer must cost a timeout, never a hang."""

    matchmaking: float = 2.0  # how long a peer declares itself looking for a group
    request: float = 1.0  # must stay below `matchmaking` (hivemind breaks cyclic join waits with it)
    next_chunk: float = 10.0  # a sender or reducer silent for this long is dropped from the group
    allreduce: float = 120.0  # bound on one whole all-reduce
    step: float = 60.0  # bound on finding a group for one stage (the broadcast waits for the cross stage)
    commit: float = 20.0  # bound on collecting every contributor's commit report


class RoundAborted(Exception):
    """A stage failed; the round keeps this peer's previous values."""


class NoGroup(RoundAborted):
    """A stage found nobody to meet before its deadline (the partners died, stalled or never came)."""


class HeadGone(RoundAborted):
    """The head a broadcast waited for dropped out of the roster (its announcement expired: it died or
    was cut off) before the broadcast began."""


def round_bits(attempt: int, stage: int, state_digest: str, level: int = 0, group: int = 0) -> str:
    """One group key per (attempt, stage, start state, tree group): a slow peer's cohort request never
    meets a fast peer's broadcast, peers that start from different states never average together, and
    each cross-cohort tree group (:mod:`peer.averaging.cross_tree`) gathers apart from the others."""
    state = int(state_digest[:4], 16) if state_digest else 0
    return (
        format(stage, "01b")
        + format(level % 8, "03b")
        + format(group % 256, "08b")
        + format(attempt % 1024, "010b")
        + format(state, "016b")
    )


class StageRunner:
    """Takes the stages of one peer's rounds, one at a time (one thread uses an instance)."""

    def __init__(
        self,
        deadlines: StageDeadlines,
        reports: ReportSource,
        timeouts: AveragingTimeouts,
        leaving: Callable[[], bool],
        online: Callable[[], Collection[str]] | None = None,
        *,
        on_broken: Callable[[], None] = lambda: None,
        barred: Callable[[], Collection[str]] = lambda: (),
        refresh_admission: Callable[[], None] = lambda: None,
    ):
        """``leaving``: whether this peer is leaving (it then stops looking for groups soon);
        ``online``: the roster's peers now (None: unknown); ``on_broken``: told when a stage's
        all-reduce broke and this peer looks for its group again (to post its refusals at once);
        ``barred``: the peers this peer refuses to meet (a unit of only such peers is not waited for);
        ``refresh_admission``: called every :data:`ONLINE_CHECK_SECONDS` while a step looks for its group
        (the matchmaking then admits the peers the roster has shown since the attempt began)."""
        self.deadlines, self.reports, self.timeouts, self.leaving = deadlines, reports, timeouts, leaving
        self.online, self.on_broken, self.barred = online, on_broken, barred
        self.refresh_admission = refresh_admission
        # What each averager was last told (by stage name): telling it again costs a round trip to its process.
        self._sizes: dict[str, int] = {}
        self._allreduce_bounds: dict[str, float] = {}
        self._following: dict[str, bool] = {}
        self._whole_parts: dict[str, bool] = {}
        # the averagers' smallest group and the members it must bring a quorum of ((2, none), as built, where absent)
        self._least: dict[str, tuple[int, frozenset[str]]] = {}
        self.superseded: Callable[[], bool] = lambda: False
        self.regrouped: list[str] = []  # this attempt's stages whose all-reduce broke and formed again

    def allreduce_bound(self, kind: str) -> float:
        """How long one all-reduce of stage ``kind`` may run once its group formed (at least twice
        hivemind's silence timeout, at most the configured all-reduce bound)."""
        return self.deadlines.allreduce_bound(
            kind, self.timeouts.allreduce, least=2.0 * self.timeouts.next_chunk
        )

    def begin_attempt(self, superseded: Callable[[], bool]) -> None:
        """``superseded`` tells a peer still looking for a group that the swarm moved on to a later round."""
        self.superseded, self.regrouped = superseded, []

    def run(
        self,
        averager: VerifiedAverager,
        name: str,
        attempt: int,
        stage: int,
        size: int,
        state_digest: str,
        watch: str = "",
        level: int = 0,
        group: int = 0,
        patience: int = 1,
        units: Sequence[Collection[str]] = (),
        live: Collection[str] | None = None,
        quorum_over: int = 0,
        gather_periods: float = GATHER_PERIODS,
        **step,
    ) -> dict:
        """One hivemind step (``stage`` 0: a stage's own averaging, 1: a broadcast); returns the gathered
        metadata by peer id.

        Not finding a group is retried until the stage's deadline (:mod:`peer.averaging.deadlines`,
        times ``patience``), then :class:`NoGroup`. An all-reduce that broke (a member joined and
        went silent) wrote nothing here; it is looked for again once, with at least two matchmaking
        periods left (a broadcast's head: exactly two), then :class:`NoGroup`. Other failures, the
        swarm moving on (``superseded``, own stages only) and leaving raise :class:`RoundAborted`.

        ``watch``: the head a broadcast's receiver waits for: its report (:attr:`reports`), or its
        dropping out of the roster (:class:`HeadGone`), ends the wait. ``units``: the peer ids behind
        each of the ``size`` members expected (empty: not checked); a unit whose peers all reported
        ``attempt``, left the roster or are barred here will not come, and is no longer waited for.
        ``live``: the peers that posted for this peer's previous attempt (None: unknown); the first
        step's wait for the whole group (:data:`GATHER_PERIODS`) waits only for units with a live
        peer. Once the group formed, its all-reduce may run as long as recent rounds suggest
        (:meth:`~peer.averaging.deadlines.StageDeadlines.allreduce_bound`). ``quorum_over``: the size
        of the roster the group's result must hold a quorum of (0: none): the group starts only with
        units whose peers can be one (:func:`.cross_tree.units_for_majority`, less the peers that
        posted a departure notice), and only once the contributors its members gathered are one
        (:class:`hivemind_adapter.group_quorum.QuorumGate`); once fewer units can still come,
        :class:`NoGroup`; with ``units`` known, it waits up to the step bound (times ``patience``)
        whatever its own deadline, as every head does, so that the first head's gather leads.
        ``gather_periods``: how many matchmaking periods the first step waits for the whole group
        (a group with ``quorum_over``: every step, to its end)."""
        # A broadcast's receivers only follow: they must not form a group of their own without the
        # sender while it is still busy with the stage before.
        follow_only = stage == 1 and bool(watch)
        partners_known = bool(watch) or bool(units)  # a leaving peer then waits while they can come
        if self._following.get(name, False) != follow_only:
            averager.set_follow_only(follow_only)
            self._following[name] = follow_only
        # A broadcast's head answers even once a receiver dropped out (receivers send nothing that
        # counts, and check the vector against its digest); every other reducer only with whole parts.
        whole_parts = not (stage == 1 and not watch)
        if self._whole_parts.get(name, True) != whole_parts:
            averager.set_whole_parts(whole_parts)
            self._whole_parts[name] = whole_parts
        bits = round_bits(attempt, stage, state_digest, level, group)
        kind = name if stage == 0 else "broadcast"
        timed_level = level if stage == 0 else 0  # a cross stage's wait: from its own level's history
        chosen = self.deadlines.deadline(kind, level=timed_level)
        bound = self.allreduce_bound(kind)
        if self._allreduce_bounds.get(name) != bound:
            averager.set_allreduce_timeout(bound)
            self._allreduce_bounds[name] = bound
        started = time.monotonic()
        deadline = started + chosen.seconds * patience
        no_group = f"{kind} stage: no group within {chosen.describe()}"
        if patience > 1:
            no_group += f" x {patience}"
        broken: Exception | None = None  # the all-reduce that broke once already, if one did
        first_step = True  # the first step waits for the whole group (GATHER_PERIODS)
        departed, quiet, least, quorum_members = self._absent_units(
            attempt, units, live, quorum_over=quorum_over
        )
        self._hold_to(averager, name, least, quorum_members)
        expected = size - departed  # shrinks as units leave the attempt
        if expected < least and size > 1:
            raise NoGroup(_too_few(kind, attempt, expected, least))
        # A group whose result must hold a quorum waits, at every head alike, up to the step bound while
        # units that can hold one may come (a head that gave up would take its cohort's votes). Alike:
        # hivemind's leader is the head whose gather ends first, and one with a shorter wait of its own
        # (no history yet) would begin with a bare quorum while other heads were on their way.
        quorum_wait = started + max(chosen.seconds, self.timeouts.step + chosen.drift) * patience
        if quorum_over and len(units) >= 2:
            deadline = quorum_wait
            no_group = (
                f"{kind} stage: no group within {quorum_wait - started:.0f} s while a quorum could come"
            )
        step_margin = self.timeouts.matchmaking + 0.5  # hivemind refuses a step with less time left

        def out_of_time() -> bool:
            return deadline - time.monotonic() <= step_margin

        while True:
            # hivemind refuses a step whose matchmaking period would not end before its timeout (it
            # raised an AssertionError here, in a head's retry of its broadcast, and lost its round)
            if out_of_time():
                raise self._no_group(no_group, broken)
            remaining = deadline - time.monotonic()
            # this step waits for the whole group: the first, and every step of a group that must hold a
            # quorum (heads arriving together after its first wait would otherwise split, 3 and 1)
            gathering = first_step or bool(quorum_over)
            target = max(least, self._target(expected, quiet, gathering))
            if self._sizes.get(name) != target:
                averager.set_target_group_size(target)
                self._sizes[name] = target
            # Before every step: hivemind moves the group bits on once a group assembles (for its own
            # Moshpit-style rounds), and a step taken again after a broken all-reduce must meet the same peers.
            averager.set_group_bits(bits)
            # a group that must hold a quorum waits for every unit still to come until a period before the
            # step ends: then the quorum gate takes whoever came (one begun early leaves heads on their way)
            gather = (
                remaining - self.timeouts.matchmaking - 1.0
                if quorum_over
                else min(gather_periods * self.timeouts.matchmaking, 0.5 * chosen.seconds, remaining - 1.0)
            )
            # (a pair cannot split; a later step of another group looks for whoever is left; a broadcast's
            # head gathers too: a receiver that finds it after one period would lose its round)
            if gathering and not follow_only and expected > 2 and gather > self.timeouts.matchmaking:
                step["scheduled_time"] = dht_time() + gather
            else:
                step.pop("scheduled_time", None)
            first_step = False
            logger.debug(
                f"attempt {attempt}: {kind} stage: a step for {target} of {expected} (at least {least}), "
                f"{'gathering' if 'scheduled_time' in step else 'not gathering'}, {remaining:.1f} s left"
            )
            control = averager.step(timeout=remaining, allow_retries=False, wait=False, **step)
            next_check = time.monotonic() + 0.5
            next_online = time.monotonic() + ONLINE_CHECK_SECONDS
            next_admission = time.monotonic()  # at the first check, then with the roster's
            offline: set[str] = set()  # the units' peers gone from the roster, as last read
            while not control.done():
                futures.wait([control], timeout=0.05)  # wakes as soon as the step ends
                averager.check_alive()  # a step of an ended process never finishes (AveragerGone)
                # Only a step still looking for its group is cancelled: cancelling a running all-reduce
                # races hivemind's own completion. A running one ends within its own timeouts.
                if time.monotonic() >= next_check and looking_for_group(control):
                    next_check = time.monotonic() + 0.5
                    if time.monotonic() >= next_admission:
                        next_admission = time.monotonic() + ONLINE_CHECK_SECONDS
                        self.refresh_admission()
                    if watch and (head_report := self.reports.read(attempt).get(watch)) is not None:
                        # The head posts its report only after its broadcasts: one that failed will not
                        # come, and one that succeeded has served everyone it is going to (its retry
                        # after a broken broadcast included).
                        cancel_step(control)
                        if not head_report.ok:
                            raise RoundAborted(f"{kind} stage abandoned: {watch[-8:]} aborted the round")
                        raise RoundAborted(
                            f"{kind} stage abandoned: {watch[-8:]} finished its broadcast without this peer"
                        )
                    if (watch or units) and self.online is not None and time.monotonic() >= next_online:
                        next_online = time.monotonic() + ONLINE_CHECK_SECONDS
                        roster_now = self._roster_now()
                        if roster_now is not None:
                            offline = {p for unit in units for p in unit} - roster_now
                        if watch and roster_now is not None and watch not in roster_now:
                            cancel_step(control)
                            raise HeadGone(
                                f"{kind} stage abandoned: {watch[-8:]} left the roster (its announcement expired)"
                            )
                    if self._leaving_for(started, partners_known):
                        cancel_step(control)
                        raise RoundAborted(
                            f"{kind} stage abandoned: this peer is leaving and no group formed"
                        )
                    # Not in the broadcast: the other cohorts may rightly be done while ours still broadcasts.
                    if stage == 0 and self.superseded():
                        cancel_step(control)
                        raise RoundAborted(f"{name} stage abandoned: the swarm moved on to a later round")
                    departed, quiet, now_least, now_quorum_members = self._absent_units(
                        attempt, units, live, offline, quorum_over
                    )
                    coming = size - departed
                    if coming < expected or now_least != least or now_quorum_members != quorum_members:
                        if coming < expected:
                            logger.info(
                                f"attempt {attempt}: {kind} stage: {size - coming} member(s) left the attempt or "
                                f"the roster, or are barred here; gathering {coming} of {size}"
                            )
                        expected, least, quorum_members = coming, now_least, now_quorum_members
                        self._hold_to(averager, name, least, quorum_members)
                        if expected < least:
                            cancel_step(control)
                            raise NoGroup(_too_few(kind, attempt, expected, least))
                        # Not cancelled and stepped again: members that already joined stay joined, and a
                        # group that is not full begins when its leader's wait ends (GATHER_PERIODS).
                        target = max(least, self._target(expected, quiet, gathering))
                        averager.set_target_group_size(target)
                        self._sizes[name] = target
            try:
                gathered = control.result()
                logger.debug(
                    f"attempt {attempt}: {kind} stage: a group of {len(gathered)} formed after "
                    f"{time.monotonic() - started:.1f} s"
                )
                if broken is not None:
                    self.regrouped.append(kind)
                break
            except (Exception, asyncio.CancelledError) as e:  # a step cancelled under it fails the stage too
                if self._leaving_for(started, partners_known):
                    raise RoundAborted(
                        f"{kind} stage abandoned: this peer is leaving and no group formed"
                    ) from e
                if "could not find a group" in str(e):
                    if not out_of_time():
                        continue  # nobody to meet yet: look again with the time that is left
                    raise self._no_group(no_group, broken) from e
                if isinstance(e, AllReduceBroke) and broken is None:
                    broken = e
                    self.on_broken()
                    regroup = time.monotonic() + 2.0 * self.timeouts.matchmaking + 0.5
                    if quorum_over:  # the survivors saw the break together: one window for all of them
                        regroup = time.monotonic() + REGROUP_QUORUM_PERIODS * self.timeouts.matchmaking + 0.5
                    # A broadcast's head has served the members that took part; the ones it missed
                    # may be looking for it still (it noticed only when their parts were overdue,
                    # often past its deadline), and a dead one must not hold it past two periods.
                    deadline = regroup if stage == 1 and not watch else max(deadline, regroup)
                    logger.info(
                        f"attempt {attempt}: {kind} stage: {e}; looking for the rest of the group again"
                    )
                    continue
                raise RoundAborted(f"{kind} stage failed: {type(e).__name__}: {e}") from e
        self.deadlines.record(kind, time.monotonic() - started, level=timed_level)
        return member_ids(gathered)

    @staticmethod
    def _no_group(no_group: str, broken: Exception | None) -> NoGroup:
        if broken is None:
            return NoGroup(no_group)
        return NoGroup(f"{no_group} again after its all-reduce broke ({broken})")

    def _leaving_for(self, started: float, partners_known: bool) -> bool:
        """Whether this leaving peer gives up a stage with no group yet (see :data:`LEAVING_GRACE_FACTOR`):
        with ``partners_known``, only the departures, the roster and the stage's deadline end its wait."""
        return (
            self.leaving()
            and not partners_known
            and time.monotonic() - started > LEAVING_GRACE_FACTOR * self.timeouts.matchmaking
        )

    def _roster_now(self) -> set[str] | None:
        """The peers in the roster now; None if the read failed or looks incomplete (it must hold this
        peer's own announcement): a failed read proves nobody gone."""
        try:
            peers = set(self.online())
        except Exception as e:
            logger.debug(f"could not read the roster: {e}")
            return None
        return peers if self.reports.peer_id in peers else None

    @staticmethod
    def _target(expected: int, quiet: int, gathering: bool) -> int:
        """The group size a step forms at once: a gathering step's, as soon as every unit that showed
        life is in (at least a pair)."""
        return expected - quiet if gathering and expected - quiet >= 2 else expected

    def _absent_units(
        self,
        attempt: int,
        units: Sequence[Collection[str]],
        live: Collection[str] | None,
        offline: Collection[str] = (),
        quorum_over: int = 0,
    ) -> tuple[int, int, int, frozenset[str]]:
        """``(departed, quiet, least, members)``: how many of ``units`` have every peer gone (a report
        of ``attempt`` in :attr:`reports`, which ends that peer's attempt; out of the roster, ``offline``;
        or barred here), how many others have no peer in ``live`` (0 if ``live`` is None), the fewest
        of the others whose peers still to come can hold a quorum of the ``quorum_over`` roster peers
        less those that posted a departure notice (2 without ``quorum_over``), and those members (a
        group must bring more than half of them; empty without ``quorum_over``). Markers are not
        reports: a peer posts none while it is still in an attempt's stages."""
        if len(units) < 2:
            return 0, 0, 2, frozenset()
        reports = self.reports.read(attempt)
        left = set(reports) | set(offline) | set(self.barred())
        departed = [bool(unit) and set(unit) <= left for unit in units]
        quiet = 0
        if live is not None:
            live = set(live)
            quiet = sum(1 for unit, gone in zip(units, departed) if not gone and not set(unit) & live)
        if not quorum_over:
            return sum(departed), quiet, 2, frozenset()
        # a quorum counts the roster less the departure notices (peer.commit.quorum); a unit brings
        # only its peers that have not ended the attempt, left the roster or been barred
        everyone = {p for unit in units for p in unit}
        notices = {p for p, r in reports.items() if r.left} & everyone
        sizes = [len(set(unit) - left) for unit, gone in zip(units, departed) if not gone]
        least = units_for_majority(sizes, quorum_over - len(notices))
        return sum(departed), quiet, least, frozenset(everyone - notices)

    def _hold_to(self, averager: VerifiedAverager, name: str, least: int, members: frozenset[str]) -> None:
        """Let ``averager``'s next steps start a group of ``least`` members or more only, and with
        ``members``, only one that brings more than half of them."""
        if self._least.get(name, (2, frozenset())) != (least, members):
            averager.set_min_group_size(least, quorum_of=sorted(members))
            self._least[name] = (least, members)


def _too_few(kind: str, attempt: int, coming: int, least: int) -> str:
    """Why a stage gives up before its group formed: fewer than ``least`` members can still come."""
    if coming <= 1:
        return f"{kind} stage: every other member left attempt {attempt} or is barred here"
    return (
        f"{kind} stage: only {coming} member(s) can still come, and fewer than {least} cannot hold a quorum"
    )
