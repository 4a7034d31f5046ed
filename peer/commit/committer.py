"""A peer's side of the commit protocol on one board: :class:`RoundCommitter`."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from peer.averaging.deadlines import StageDeadlines
from peer.commit.boards import CommitBoard, ReportSource
from peer.commit.quorum import attempt_decided, quorum_late
from peer.commit.report import CommitReport
from peer.commit.waits import (
    CommitDecision,
    PartnersChecked,
    await_attempt_decided,
    await_commit,
    await_partners_checked,
    await_quorum_reports,
)

logger = logging.getLogger(__name__)

PENDING_KEPT = 4  # posted results still looked at for a late commit

T = TypeVar("T")


@dataclass(frozen=True)
class PendingResult(Generic[T]):
    """A result this peer posted for ``attempt`` and saw no quorum for: it commits late if the others'
    reports make one after all, while this peer still holds ``start_state``. ``payload``: what the
    caller needs to apply it then."""

    attempt: int
    roster: frozenset[str]
    digest: str
    start_state: str
    public_keys: Mapping[str, str] | None
    ended: float  # time.monotonic() when the attempt ended here
    payload: T


class RoundCommitter:
    """Owns one board's side of a peer's attempts: what it posts (results, markers, departures, state
    reports), how long it waits for a quorum, settling after a failed attempt, late commits, and the
    attempt counter (:attr:`attempt`: the next attempt this peer takes part in).

    ``deadlines`` are the peer's stage deadlines on this board (the commit wait is one of them);
    ``online`` reads the roster's peers now (None: the roster is not known here). One thread uses it.
    """

    def __init__(
        self,
        board: CommitBoard,
        deadlines: StageDeadlines,
        commit_ceiling: float,
        online: Callable[[], Collection[str]] | None = None,
    ):
        self.board, self.deadlines, self.commit_ceiling, self.online = (
            board,
            deadlines,
            commit_ceiling,
            online,
        )
        self.peer_id = board.peer_id
        self.attempt = 0
        # (attempt, roster) when every roster peer had posted for that attempt by this peer's commit
        self.everyone_posted: tuple[int, frozenset[str]] | None = None
        self._waited_out: int | None = None  # the last attempt whose commit wait ran out here
        self._pending: list[PendingResult] = []

    @property
    def reports(self) -> ReportSource:
        """Where the round's stages learn who ended an attempt: the board."""
        return self.board

    # ------------------------------------------------------------------ the attempt counter

    def skip_past(self, attempt: int) -> None:
        """The swarm ended ``attempt`` (a state of it was loaded, or it was sat out): take part after it."""
        self.attempt = max(self.attempt, attempt + 1)

    def meet_swarm(self) -> None:
        """Start where the swarm is: past the latest attempt anyone ended."""
        self.skip_past(self.board.latest_attempt())

    def advance(self, cohort_peers: Collection[str] | None = None) -> int:
        """After an attempt: :meth:`next_attempt` becomes the counter; returns it."""
        self.attempt = self.next_attempt(self.attempt, cohort_peers)
        return self.attempt

    def next_attempt(self, after: int, cohort_peers: Collection[str] | None = None) -> int:
        """One past the highest attempt anyone ended (of ``cohort_peers`` only, for an outer task's
        inner steps, which only the cohort takes together), so peers whose aborts took different
        times meet again on the same attempt. Where every one of ``cohort_peers`` posted for
        ``after``, none is past it and the board need not be read."""
        peers = None if cohort_peers is None else frozenset(cohort_peers) | {self.peer_id}
        if peers is not None and self.everyone_posted == (after, peers):
            return after + 1
        return max(after, self.board.latest_attempt(peers, near=after)) + 1

    # ------------------------------------------------------------------ posting

    def open_attempt(self, attempt: int, roster: Collection[str], cohorts: Sequence[Collection[str]]) -> None:
        """``attempt`` begins among ``roster`` (its cohorts by rank): nothing to prepare on a board."""

    def post_result(self, attempt: int, report: CommitReport) -> None:
        """This peer's report of ``attempt`` (a result or a failure), not waiting for the DHT's store:
        the first reads of the wait overlap it."""
        self.board.post(attempt, report, wait=False)

    def post_marker(self, attempt: int, marker: CommitReport) -> None:
        """What this peer checked so far in ``attempt`` (:meth:`CommitReport.marker`)."""
        self.board.post(attempt, marker, wait=False)

    def leave(self, attempt: int) -> None:
        """Tell the swarm this peer takes no part in ``attempt``: its cohort stops waiting for it and
        the quorum no longer counts it. A failed store is logged: the others then time out."""
        try:
            self.board.post(attempt, CommitReport.departure())
        except Exception as e:
            logger.debug(f"departure notice failed: {e}")

    def report_state(self, attempt: int, report: CommitReport, state_digest: str) -> None:
        """After applying ``report``'s result of ``attempt``: say which state this peer now holds, so
        peers catching up know whom to ask (catch-up falls back to state sharing if the store fails)."""
        try:
            self.board.post(attempt, report.holding(state_digest), wait=False)
        except Exception as e:
            logger.debug(f"state report failed: {e}")

    def note_everyone_posted(self, attempt: int, roster: Collection[str]) -> None:
        """Every peer of ``roster`` took part in ``attempt`` to its end (a roster of one, or a known
        group that confirmed its result): the next attempt needs no read to know it."""
        self.everyone_posted = (attempt, frozenset(roster))

    # ------------------------------------------------------------------ waiting

    def commit_wait(self) -> float:
        """How long a peer that posted its result waits for a quorum to hold it, by recent commits."""
        return self.deadlines.deadline("commit", ceiling=self.commit_ceiling).seconds

    def await_quorum(
        self,
        attempt: int,
        digest: str,
        roster: Collection[str],
        *,
        extra_seconds: float,
        witnesses: Collection[str],
        public_keys: Mapping[str, str] | None,
    ) -> CommitDecision:
        """:func:`~peer.commit.waits.await_commit` for this peer's posted result, for the commit wait
        plus ``extra_seconds`` (the broadcasts this peer had no part in); records what it learned."""
        started = time.monotonic()
        decision = await_commit(
            self.board, attempt, digest, roster, self.commit_wait() + extra_seconds,
            never=functools.partial(self.never_reporting, attempt, roster), public_keys=public_keys,
            witnesses=witnesses,
        )  # fmt: skip
        if decision.committed:
            self.deadlines.record("commit", time.monotonic() - started)
        seen_all = set(roster) <= decision.seen | {self.peer_id}
        self.everyone_posted = (attempt, frozenset(roster)) if seen_all else None
        if decision.timed_out:
            self._waited_out = attempt
        return decision

    def await_partners(
        self,
        attempt: int,
        token: str,
        partners: Collection[str],
        bound: float,
        public_keys: Mapping[str, str] | None,
    ) -> PartnersChecked:
        """:func:`~peer.commit.waits.await_partners_checked` for a group of three, for ``bound`` plus
        the commit wait."""
        return await_partners_checked(
            self.board, attempt, token, partners, bound + self.commit_wait(),
            never=lambda: self.never_reporting(attempt, partners), public_keys=public_keys,
        )  # fmt: skip

    def settle(self, attempt: int, roster: Collection[str], levels: int = 1) -> bool:
        """After this peer's ``attempt`` failed: wait until a quorum of ``roster`` reported (bounded by
        the attempt's stage deadlines over ``levels`` tree levels) and its outcome is decided (bounded
        by the commit wait), so the next attempt starts together and the state the others committed
        is there to catch up with. Returns whether both happened. A peer that already waited out its
        commit wait for ``attempt`` does not wait for the outcome a second time."""
        everyone = set(roster) | {self.peer_id}
        never = functools.partial(self.never_reporting, attempt, everyone)
        if not await_quorum_reports(self.board, attempt, everyone, self.deadlines.total(levels), never):
            return False
        if self._waited_out == attempt:
            return attempt_decided(self.board.read(attempt), everyone, never())
        return await_attempt_decided(self.board, attempt, everyone, self.commit_wait(), never)

    def never_reporting(self, attempt: int, roster: Collection[str]) -> set[str]:
        """Roster peers that will not report for ``attempt``: gone from the roster (dead or cut off).
        Empty where the roster is not known here or cannot be read whole."""
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

    def live_peers(self, previous_attempt: int | None, inner_step: bool = False) -> set[str] | None:
        """The peers that posted anything for ``previous_attempt`` (None: no previous attempt, or
        nothing seen). An inner step whose previous attempt every roster peer took part in knows
        them without a read."""
        if previous_attempt is None:
            return None
        if inner_step and self.everyone_posted is not None and self.everyone_posted[0] == previous_attempt:
            return set(self.everyone_posted[1])
        try:
            reported = set(self.board.read(previous_attempt))
        except Exception as e:  # the DHT may fail a read; then every member is waited for
            logger.debug(f"could not read attempt {previous_attempt}'s reports: {e}")
            return None
        return (reported | {self.peer_id}) if reported else None

    # ------------------------------------------------------------------ late commits

    def quorum_now(
        self, attempt: int, roster: Collection[str], digest: str, public_keys: Mapping[str, str] | None
    ) -> bool:
        """After :meth:`settle`: whether result ``digest``, posted here and given up on, holds a quorum
        of ``roster`` now (:func:`~peer.commit.quorum.quorum_late`). False if the board cannot be read."""
        try:
            reports = self.board.read(attempt)
        except Exception as e:  # the round stays aborted; catch-up follows
            logger.debug(f"could not read attempt {attempt}'s reports again: {e}")
            return False
        late = quorum_late(reports, set(roster) | {self.peer_id}, digest, public_keys)
        if late:
            logger.info(
                f"attempt {attempt}: its result reached a quorum after this peer gave up waiting: committed"
            )
        return late

    def hold(self, pending: PendingResult) -> None:
        """Keep a posted result that may still commit (the newest :data:`PENDING_KEPT`)."""
        self._pending = [*self._pending, pending][-PENDING_KEPT:]

    def drop_pending(self) -> None:
        """A new state: no older result applies to it."""
        self._pending = []

    def pending_with_quorum(self, state_digest: str) -> PendingResult | None:
        """The newest held result that a quorum of its roster holds now, if this peer still holds the
        state it started from (held results of other states are dropped); None: none does, or the
        board cannot be read (it is looked at again next time)."""
        self._pending = [p for p in self._pending if p.start_state == state_digest]
        for candidate in reversed(self._pending):
            try:
                reports = self.board.read(candidate.attempt)
            except Exception as e:
                logger.debug(f"could not read attempt {candidate.attempt}'s reports: {e}")
                continue
            roster = candidate.roster | {self.peer_id}
            if quorum_late(reports, roster, candidate.digest, candidate.public_keys):
                return candidate
        return None
