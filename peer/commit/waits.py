"""Bounded waits on a commit board: for a quorum on this peer's result, for a group of three's
confirmations, for the others to end an attempt. Each re-reads the board at a pace that follows the
board (:class:`ReadPace`: once soon after the first read, then every :data:`COMMIT_POLL_SECONDS`
while reports arrive, ever less often, up to every :data:`COMMIT_POLL_MAX_SECONDS`, while none
does) and asks which roster peers will never report at most every :data:`NEVER_POLL_SECONDS` (a
roster read)."""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

from peer.commit.boards import CommitBoard
from peer.commit.quorum import (
    attempt_decided,
    equivocation_in,
    holders_of,
    is_quorum,
    members_of,
    result_holds_quorum,
)
from protocol.proof_attestation import Equivocation, find_equivocation, parse_tokens

COMMIT_FIRST_REREAD_SECONDS = 0.025  # how soon a peer reads the board again after its first read
COMMIT_POLL_SECONDS = 0.1  # how often a peer re-reads the board while reports arrive
COMMIT_POLL_MAX_SECONDS = 0.8  # ... and at most, while none does
NEVER_POLL_SECONDS = 2.0  # how often it asks which roster peers will never report (a roster read)
# Once its result holds a quorum, how long a peer still waits for the other contributors' reports
# (their proof attestations may show a reducer's equivocation); a silent one costs at most this.
WITNESS_GRACE_SECONDS = 2.0

Never = Callable[[], Collection[str]]


@dataclass(frozen=True)
class CommitDecision:
    """How a wait for a quorum on this peer's result ended."""

    committed: bool
    reason: str = ""
    agreeing: int = 0  # peers that posted this peer's digest when it decided
    timed_out: bool = False  # undecided when the wait ended (not: decided against this result)
    seen: frozenset[str] = frozenset()  # the peers that had posted anything for the attempt, last read
    equivocation: Equivocation | None = None  # a reducer's two signed, different proofs, if posted


@dataclass(frozen=True)
class PartnersChecked:
    """How the wait for a group of three's confirmations ended."""

    confirmed: bool
    reason: str = ""  # why not, if not
    equivocation: Equivocation | None = None  # a reducer's two signed, different proofs, if posted


def await_commit(
    board: CommitBoard,
    attempt: int,
    digest: str,
    roster: Collection[str],
    deadline_seconds: float,
    never: Never | None = None,
    public_keys: Mapping[str, str] | None = None,
    witnesses: Collection[str] = (),
) -> CommitDecision:
    """Wait (at most ``deadline_seconds``) until the holders of ``digest`` for ``attempt`` are a quorum
    of ``roster``; give up early once that can no longer happen. This peer's own report must already
    be on the board.

    Never commits while the reports show a reducer's equivocation (signatures under ``public_keys``).
    Once the quorum holds it waits up to :data:`WITNESS_GRACE_SECONDS` for the ``witnesses`` (the
    other contributors) still to report. ``never``: roster peers that will not report (gone from
    the roster); they only hasten giving up, never a commit."""
    deadline = time.monotonic() + deadline_seconds
    pace = ReadPace(deadline)
    gone = _Throttled(never)
    witnessed_by: float | None = None  # when the quorum held: the wait for witnesses ends then
    while True:
        reports = board.read(attempt)
        members = members_of(reports, roster)
        agreeing = holders_of(reports, digest)
        if (equivocation := equivocation_in(reports, public_keys)) is not None:
            return CommitDecision(
                False, f"not committed: {equivocation.describe()}", len(agreeing),
                seen=frozenset(reports), equivocation=equivocation,
            )  # fmt: skip
        if result_holds_quorum(reports, roster, digest):
            witnessed_by = witnessed_by or time.monotonic() + WITNESS_GRACE_SECONDS
            missing = set(witnesses) - reports.keys() - gone()
            if not missing or time.monotonic() > min(witnessed_by, deadline):
                return CommitDecision(True, "", len(agreeing), seen=frozenset(reports))
            pace.deadline = min(witnessed_by, deadline)
            pace.wait(frozenset(reports))
            continue
        undecided = members - reports.keys()
        silent = gone() & undecided
        if not is_quorum(agreeing | (undecided - silent), members):
            others = len([p for p in members & reports.keys() if p not in agreeing])
            said = f", {len(silent)} gone from the roster" if silent else ""
            return CommitDecision(
                False,
                f"no quorum for this result: {len(agreeing & members)} of {len(members)} roster peer(s) hold it, "
                f"{others} reported a failure or another result{said}",
                len(agreeing),
                seen=frozenset(reports),
            )
        if time.monotonic() > deadline:
            return CommitDecision(
                False,
                f"no quorum within {deadline_seconds:.0f} s: {len(agreeing & members)} of {len(members)} roster "
                f"peer(s) reported this result, {len(undecided)} reported nothing",
                len(agreeing),
                timed_out=True,
                seen=frozenset(reports),
            )
        pace.wait(frozenset(reports))


def await_partners_checked(
    board: CommitBoard,
    attempt: int,
    token: str,
    partners: Collection[str],
    deadline_seconds: float,
    never: Never | None = None,
    public_keys: Mapping[str, str] | None = None,
) -> PartnersChecked:
    """Wait (at most ``deadline_seconds``) until every one of ``partners`` lists ``token`` (this peer's
    :func:`~protocol.averaging_group.stage_check_token` of an all-reduce of three they shared) in its
    record of ``attempt``. Ends unconfirmed as soon as a partner reported the attempt without it,
    left the roster (``never``), refused a group member's averages, or the records show a reducer's
    equivocation. This peer's own marker must already be posted.

    Why: in a group of three, a reducer that holds one member's results back can list that member's
    entry anywhere in its proof (:mod:`robust_aggregation.reducer_proof`, point 6); nobody goes on
    until both partners say they checked the same result (docs/protocol.md, "Groups of three")."""
    deadline = time.monotonic() + deadline_seconds
    pace = ReadPace(deadline)
    gone = _Throttled(never)
    while True:
        checks = board.read_checks(attempt)
        posted_proofs = ((p, parse_tokens(c.proofs)) for p, c in sorted(checks.items()))
        if (equivocation := find_equivocation(posted_proofs, public_keys)) is not None:
            return PartnersChecked(False, equivocation.describe(), equivocation)
        group = set(partners) | {board.peer_id}
        for partner in sorted(partners):
            posted = checks.get(partner)
            if posted is not None and (refused := sorted(set(posted.refused) & (group - {partner}))):
                return PartnersChecked(
                    False, f"{partner[-8:]} refused the averages of {', '.join(p[-8:] for p in refused)}"
                )
        waiting = []
        for partner in sorted(partners):
            posted = checks.get(partner)
            if posted is not None and token in posted.checked:
                continue
            if posted is not None and not posted.checking:
                return PartnersChecked(
                    False, f"{partner[-8:]} reported the attempt without confirming this group's result"
                )
            waiting.append(partner)
        if not waiting:
            return PartnersChecked(True)
        if left := gone() & set(waiting):
            gone_ones = ", ".join(p[-8:] for p in sorted(left))
            return PartnersChecked(
                False, f"{gone_ones} left the roster before confirming this group's result"
            )
        if time.monotonic() > deadline:
            return PartnersChecked(
                False,
                f"{', '.join(p[-8:] for p in waiting)} did not confirm this group's result "
                f"within {deadline_seconds:.0f} s",
            )
        pace.wait(frozenset(checks))


def await_quorum_reports(
    board: CommitBoard,
    attempt: int,
    roster: Collection[str],
    deadline_seconds: float,
    never: Never | None = None,
) -> bool:
    """Wait (at most ``deadline_seconds``) until a quorum of ``roster`` posted anything for ``attempt``
    (a result, a failure or a departure) or is done with it otherwise (``never``). Returns whether
    they did."""
    done = _Throttled(never)
    return _poll(lambda: is_quorum(set(board.read(attempt)) | done(), roster), deadline_seconds)


def await_attempt_decided(
    board: CommitBoard,
    attempt: int,
    roster: Collection[str],
    deadline_seconds: float,
    never: Never | None = None,
) -> bool:
    """Wait (at most ``deadline_seconds``) until :func:`~peer.commit.quorum.attempt_decided`. Returns
    whether it was."""
    done = _Throttled(never)
    return _poll(lambda: attempt_decided(board.read(attempt), roster, done()), deadline_seconds)


class ReadPace:
    """When to read a board next: :data:`COMMIT_FIRST_REREAD_SECONDS` after the first read (a
    partner's report often lands just after this peer's), :data:`COMMIT_POLL_SECONDS` after a read
    that saw something new, half as long again after each read that saw nothing new, at most
    :data:`COMMIT_POLL_MAX_SECONDS`; never past ``deadline`` (a ``time.monotonic()`` value)."""

    def __init__(self, deadline: float):
        self.deadline, self.interval, self.seen = deadline, None, None  # interval None: no read yet

    def next_interval(self, seen: object = None) -> float:
        """The wait before the next read, given what this read saw (anything comparable)."""
        if self.interval is None:
            self.interval, self.seen = COMMIT_FIRST_REREAD_SECONDS, seen
        elif self.interval < COMMIT_POLL_SECONDS or (seen is not None and seen != self.seen):
            self.interval, self.seen = COMMIT_POLL_SECONDS, seen
        else:
            self.interval = min(COMMIT_POLL_MAX_SECONDS, self.interval * 1.5)
        return max(0.0, min(self.interval, self.deadline - time.monotonic()))

    def wait(self, seen: object = None) -> None:
        time.sleep(self.next_interval(seen))


class _Throttled:
    """``never()``, asked at most every :data:`NEVER_POLL_SECONDS` (a roster read), first after that
    long (most waits end sooner); the last answer in between."""

    def __init__(self, never: Never | None):
        self.never, self.last, self.at = never, set(), time.monotonic()

    def __call__(self) -> set[str]:
        if self.never is not None and time.monotonic() - self.at >= NEVER_POLL_SECONDS:
            self.last, self.at = set(self.never()), time.monotonic()
        return self.last


def _poll(condition: Callable[[], bool], deadline_seconds: float) -> bool:
    """Re-check ``condition`` at a :class:`ReadPace` until it holds (True) or ``deadline_seconds``
    passed (False)."""
    deadline = time.monotonic() + deadline_seconds
    pace = ReadPace(deadline)
    while True:
        if condition():
            return True
        if time.monotonic() > deadline:
            return False
        pace.wait()
