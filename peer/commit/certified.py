"""A peer's rounds decided by commit certificates (a task's ``commit: certificates``):
:class:`CertifiedCommitter`.

Each report a peer posts it also votes for (a failure as :data:`~protocol.commit_certificate.ABORTED`,
a departure as :data:`~protocol.commit_certificate.DEPARTED`) over its
:class:`~peer.commit.certificate_channel.CertificateChannel`. It commits once the votes it checked
for one result are more than half of the attempt's roster less the departures it saw, settles on
the attempt's decision, and takes its next attempt number from the votes it hears. Nothing on that
path reads a board or the roster: a wait asks its unheard peers directly whether they are there. The board
still carries what is not decided yet by certificates: results (the guard's proofs), partner markers,
departures, and the state reports catch-up reads.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

from peer.averaging.deadlines import StageDeadlines
from peer.commit.boards import CommitBoard
from peer.commit.certificate_channel import PROBE_TIMEOUT, CertificateChannel
from peer.commit.committer import PendingResult, RoundCommitter
from peer.commit.report import CommitReport
from peer.commit.waits import CommitDecision
from protocol.commit_certificate import ABORTED, DEPARTED, CommitCertificate, RosterSnapshot, sign_vote
from protocol.identity import Identity

logger = logging.getLogger(__name__)

OPEN_KEPT = 8  # attempts whose scope is remembered here (late commits look back this far)
SKIPPED_VOTED = 2  # attempts skipped past that a peer still votes in (as departed), newest first
LEFT_CHECK_SECONDS = 2.0  # an undecided wait probes its unheard peers this often
SILENT_STRIKES = 3  # probes in a row a peer did not answer before it counts as gone


@dataclass(frozen=True)
class CertificateVotes:
    """What a peer votes with: its channel, its MANTA key, and a reader of the admitted roster's
    keys (peer id -> hex)."""

    channel: CertificateChannel
    identity: Identity
    keys: Callable[[], Mapping[str, str]]


@dataclass(frozen=True)
class VotesHeard:
    """The votes a peer heard, as the reports a round's stages read (a vote for a result is a
    result report, :data:`ABORTED` a failure, :data:`DEPARTED` a departure notice): only cohort
    mates' and the tree's, no board read."""

    channel: CertificateChannel
    peer_id: str

    def read(self, attempt: int) -> dict[str, CommitReport]:
        return {
            peer: _as_report(digest, group) for peer, (digest, group) in self.channel.votes(attempt).items()
        }


def _as_report(digest: str, group: str) -> CommitReport:
    if digest == ABORTED:
        return CommitReport()
    if digest == DEPARTED:
        return CommitReport.departure()
    return CommitReport(ok=True, digest=digest, group=group)


def cohort_scopes(
    roster: Collection[str], cohorts: Sequence[Collection[str]], keys: Mapping[str, str]
) -> dict[str, str]:
    """Peer id -> the scope it votes in: its cohort's rank (``c0003``), or ``all`` where the cohorts
    are not known; only peers with a key count."""
    if cohorts:
        return {p: f"c{rank:04d}" for rank, members in enumerate(cohorts) for p in members if p in keys}
    return {p: "all" for p in roster if p in keys}


class CertifiedCommitter(RoundCommitter):
    """:class:`RoundCommitter` whose decisions come from commit certificates cast with ``votes``.
    One thread uses it, as the base class."""

    def __init__(
        self,
        board: CommitBoard,
        deadlines: StageDeadlines,
        commit_ceiling: float,
        online: Callable[[], Collection[str]] | None,
        votes: CertificateVotes,
    ):
        super().__init__(board, deadlines, commit_ceiling, online)
        self.channel, self.identity, self.keys = votes.channel, votes.identity, votes.keys
        self.task_id = votes.channel.task_id
        self._scopes: dict[int, str] = {}  # attempt -> this peer's scope, where it is open
        self._heard = VotesHeard(self.channel, self.peer_id)
        self._voted: set[int] = set()  # attempts this peer voted in (of those in _scopes)
        self._named: set[tuple[int, str]] = set()  # (attempt, peer) equivocations logged
        # the roster and cohorts of the newest attempt opened here: attempts skipped past are voted in as it
        self._last_open: tuple[int, frozenset[str], tuple[tuple[str, ...], ...]] | None = None
        self._silent: dict[tuple[int, str], int] = {}  # (attempt, peer) -> probes in a row it did not answer

    @property
    def reports(self) -> VotesHeard:
        """The votes heard: the stages' reports."""
        return self._heard

    def open_attempt(self, attempt: int, roster: Collection[str], cohorts: Sequence[Collection[str]]) -> None:
        """Relay ``attempt``'s certificates among ``roster``, whose cohorts (by rank) are ``cohorts``."""
        if attempt in self._scopes:
            return
        keys = {**self.keys(), self.peer_id: self.identity.public_key_hex}  # its own, whatever the read held
        scopes = cohort_scopes(set(roster) | {self.peer_id}, cohorts, keys)
        if self.peer_id not in scopes:
            logger.warning(f"attempt {attempt}: this peer is in none of its roster's cohorts: it cannot vote")
            return
        self.channel.open(attempt, RosterSnapshot({p: keys[p] for p in scopes}, scopes))
        self._scopes[attempt] = scopes[self.peer_id]
        if self._last_open is None or attempt > self._last_open[0]:
            self._last_open = (attempt, frozenset(roster), tuple(tuple(c) for c in cohorts))
        for old in [a for a in self._scopes if a <= attempt - OPEN_KEPT]:
            del self._scopes[old]
            self._voted.discard(old)
        self._named = {(a, p) for a, p in self._named if a > attempt - OPEN_KEPT}

    def post_result(self, attempt: int, report: CommitReport) -> None:
        """On the board (the guard reads results there), and as this peer's vote."""
        super().post_result(attempt, report)
        if report.ok and report.digest:
            self._vote(attempt, report.digest, report.group)
        else:
            self._vote(attempt, ABORTED, "")

    def leave(self, attempt: int) -> None:
        """A departure notice on the board and, where ``attempt`` is open here, a departure vote
        (the attempt's majority is then taken without this peer)."""
        super().leave(attempt)
        try:
            self._vote(attempt, DEPARTED, "")
        except Exception as e:  # the channel may be closing with the peer
            logger.debug(f"departure vote for attempt {attempt} failed: {e}")

    def _vote(self, attempt: int, digest: str, group: str) -> None:
        """This peer's one vote in ``attempt`` (a second would be an equivocation: it is not cast)."""
        scope = self._scopes.get(attempt)
        if scope is None or attempt in self._voted:
            return
        self._voted.add(attempt)
        signature = sign_vote(self.identity, self.task_id, attempt, digest, group)
        vote = CommitCertificate(self.task_id, attempt, scope, digest, group, {self.peer_id: signature})
        self.channel.vote(attempt, vote)

    def advance(self, cohort_peers: Collection[str] | None = None) -> int:
        """As the base class; in the newest :data:`SKIPPED_VOTED` attempts it skips past (the swarm
        ran them while this peer was still waiting on its own) it votes :data:`DEPARTED`, so peers
        still waiting on them stop counting it as a vote to come."""
        after = self.attempt
        attempt = super().advance(cohort_peers)
        if cohort_peers is None and self._last_open is not None:
            _, roster, cohorts = self._last_open
            for skipped in range(max(after + 1, attempt - SKIPPED_VOTED), attempt):
                self.open_attempt(skipped, roster, cohorts)
                self._vote(skipped, DEPARTED, "")
        return attempt

    def next_attempt(self, after: int, cohort_peers: Collection[str] | None = None) -> int:
        """One past the latest attempt a roster peer voted in, as heard here (an outer task's inner
        steps: as the base class, from the cohort's board)."""
        if cohort_peers is not None:
            return super().next_attempt(after, cohort_peers)
        return max(after, self.channel.latest_attempt()) + 1

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
        """Wait, for the commit wait plus ``extra_seconds``, until the votes decide ``attempt``."""
        if attempt not in self._scopes:
            return CommitDecision(False, "this peer has no vote in its roster's certificates")
        started = time.monotonic()
        decided, gone = self._wait_decided(attempt, roster, self.commit_wait() + extra_seconds)
        self._name_equivocators(attempt)
        voters = self.channel.voters(attempt) or frozenset()
        seen_all = set(roster) <= voters | {self.peer_id}
        self.everyone_posted = (attempt, frozenset(roster)) if seen_all else None
        if decided == digest:
            self.deadlines.record("commit", time.monotonic() - started)
            return CommitDecision(True, agreeing=len(voters), seen=voters)
        if decided is None:
            self._waited_out = attempt
            self._log_undecided(attempt, time.monotonic() - started, gone)
            why = f"no result with votes from a majority of the roster ({len(voters)} voted)"
            if gone:
                why += f"; the {gone} peer(s) not heard from do not answer"
            return CommitDecision(False, why, timed_out=True, seen=voters)
        if decided == ABORTED:
            return CommitDecision(False, "certificates: no result can reach a majority", seen=voters)
        return CommitDecision(False, f"certificates committed another result ({decided[:8]})", seen=voters)

    def _wait_decided(self, attempt: int, roster: Collection[str], timeout: float) -> tuple[str | None, int]:
        """``attempt``'s decision, waiting up to ``timeout`` s, and how many roster peers not heard from
        were gone when the wait ended early (0: it did not). A wait ends early once every peer still
        to vote is gone (:meth:`never_reporting`): killed peers never vote, and while they count as
        unheard no majority can be ruled out. Ending the wait decides nothing (late commits stand)."""
        deadline = time.monotonic() + timeout
        everyone = set(roster) | {self.peer_id}
        self.channel.keep_asking(attempt, timeout)  # the decision may come from others' certificates only
        while True:
            left = deadline - time.monotonic()
            decided = self.channel.wait_decided(attempt, max(0.0, min(LEFT_CHECK_SECONDS, left)))
            if decided is not None or left <= LEFT_CHECK_SECONDS:
                return decided, 0
            if left <= LEFT_CHECK_SECONDS + PROBE_TIMEOUT:
                continue  # a probe now could outlast the wait
            unheard = everyone - (self.channel.voters(attempt) or frozenset())
            if unheard and unheard <= self.never_reporting(attempt, unheard):
                return None, len(unheard)

    def never_reporting(self, attempt: int, roster: Collection[str]) -> set[str]:
        """Peers of ``roster`` that will not vote in ``attempt``: probed directly (no roster read),
        they did not answer :data:`SILENT_STRIKES` probes in a row. Each call probes up to
        :data:`~peer.commit.certificate_channel.PROBE_MOST` of them once."""
        others = set(roster) - {self.peer_id}
        if not others:
            return set()
        probe = self.channel.probe(attempt, others)
        for stale in [k for k in self._silent if k[0] < attempt - OPEN_KEPT]:
            del self._silent[stale]
        for peer in probe.answered:
            self._silent.pop((attempt, peer), None)
        for peer in probe.silent:
            self._silent[(attempt, peer)] = self._silent.get((attempt, peer), 0) + 1
        return {p for p in others if self._silent.get((attempt, p), 0) >= SILENT_STRIKES}

    def _log_undecided(self, attempt: int, waited: float, gone: int = 0) -> None:
        hearing = self.channel.hearing(attempt)
        if hearing is not None:
            left = f"; the {gone} peer(s) not heard from do not answer" if gone else ""
            logger.info(f"attempt {attempt}: undecided after {waited:.0f} s: {hearing.describe()}{left}")

    def _name_equivocators(self, attempt: int) -> None:
        """Log each key seen voting twice in ``attempt`` (its votes count nowhere), once."""
        for equivocation in self.channel.equivocations(attempt):
            if (attempt, equivocation.peer_id) not in self._named:
                self._named.add((attempt, equivocation.peer_id))
                logger.warning(f"attempt {attempt}: {equivocation.describe()}: its votes count nowhere")

    def settle(self, attempt: int, roster: Collection[str], levels: int = 1) -> bool:
        """Wait until certificates decide ``attempt`` (bounded by its stage deadlines over ``levels``
        tree levels, plus the commit wait unless this peer waited it out already)."""
        if attempt not in self._scopes:
            return False
        bound = self.deadlines.total(levels) + (0.0 if self._waited_out == attempt else self.commit_wait())
        started = time.monotonic()
        decided, gone = self._wait_decided(attempt, roster, bound)
        self._name_equivocators(attempt)
        if decided is None:
            self._log_undecided(attempt, time.monotonic() - started, gone)
        return decided is not None

    def live_peers(self, previous_attempt: int | None, inner_step: bool = False) -> set[str] | None:
        """The peers that voted in ``previous_attempt`` (None: none heard, or not open here)."""
        if previous_attempt is None or previous_attempt not in self._scopes:
            return None
        voters = self.channel.voters(previous_attempt)
        return (set(voters) | {self.peer_id}) if voters else None

    def quorum_now(
        self, attempt: int, roster: Collection[str], digest: str, public_keys: Mapping[str, str] | None
    ) -> bool:
        """Whether certificates committed ``digest`` for ``attempt`` by now."""
        late = attempt in self._scopes and self.channel.wait_decided(attempt, 0) == digest
        if late:
            logger.info(f"attempt {attempt}: certificates committed its result after this peer gave up")
        return late

    def pending_with_quorum(self, state_digest: str) -> PendingResult | None:
        """The newest held result that certificates committed since, if this peer still holds the
        state it started from."""
        self._pending = [p for p in self._pending if p.start_state == state_digest]
        for candidate in reversed(self._pending):
            if (
                candidate.attempt in self._scopes
                and self.channel.wait_decided(candidate.attempt, 0) == candidate.digest
            ):
                return candidate
        return None
