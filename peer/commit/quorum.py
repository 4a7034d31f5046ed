"""The quorum rules, pure functions of the reports read for an attempt.

A peer commits its result once the peers that posted *the same digest* are more than half of its
roster (less those that posted a departure notice for the attempt). Two such majorities share a
peer, and a peer posts one digest per attempt, so at most one result of an attempt commits, even
when the swarm split into groups that never met. A peer outside that majority keeps its values.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from peer.commit.boards import CommitBoard
from peer.commit.report import CommitReport
from protocol.proof_attestation import Equivocation, find_equivocation, parse_tokens

Reports = Mapping[str, CommitReport]


def is_quorum(peers: Collection[str], roster: Collection[str]) -> bool:
    """Whether ``peers`` are more than half of ``roster``. Strict: majorities of two rosters that
    differ by one peer (read at slightly different times) still share a peer; tie-broken halves do not."""
    members = set(roster)
    return 2 * len(set(peers) & members) > len(members)


def members_of(reports: Reports, roster: Collection[str]) -> set[str]:
    """``roster`` less the peers that posted a departure notice (they never post a result)."""
    return set(roster) - {p for p, r in reports.items() if r.left}


def holders_of(reports: Reports, digest: str) -> set[str]:
    """The peers whose report is result ``digest``."""
    return {p for p, r in reports.items() if r.holds(digest)}


def result_holds_quorum(reports: Reports, roster: Collection[str], digest: str) -> bool:
    """Whether the holders of result ``digest`` are a quorum of ``roster``: the rule every commit follows."""
    return bool(digest) and is_quorum(holders_of(reports, digest), members_of(reports, roster))


def equivocation_in(reports: Reports, public_keys: Mapping[str, str] | None) -> Equivocation | None:
    """A reducer's equivocation among the proof attestations that ``reports`` carry (signatures
    checked under ``public_keys``; None: compared as posted, a swarm whose peers trust each other)."""
    posted = ((peer, parse_tokens(report.proofs)) for peer, report in sorted(reports.items()))
    return find_equivocation(posted, public_keys)


def quorum_late(
    reports: Reports, roster: Collection[str], digest: str, public_keys: Mapping[str, str] | None
) -> bool:
    """Whether a result a peer posted and gave up on holds a quorum now, with no equivocation shown:
    the rule of a commit, applied later, so that the late peer ends on the state the others hold."""
    return result_holds_quorum(reports, roster, digest) and equivocation_in(reports, public_keys) is None


def attempt_decided(reports: Reports, roster: Collection[str], never: Collection[str] = frozenset()) -> bool:
    """Whether an attempt's outcome is settled: one result holds a quorum of ``roster``, or no result
    can reach one any more, not even one only the peers yet to report would hold. ``never``: roster
    peers that will not report (gone from the roster)."""
    held, reachable = _quorum_held_and_reachable(reports, roster, never)
    return held or not reachable


def attempt_aborted(reports: Reports, roster: Collection[str], never: Collection[str] = frozenset()) -> bool:
    """Whether no result of an attempt holds a quorum of ``roster``, nor can reach one any more
    (``never`` as for :func:`attempt_decided`)."""
    held, reachable = _quorum_held_and_reachable(reports, roster, never)
    return not held and not reachable


def _quorum_held_and_reachable(
    reports: Reports, roster: Collection[str], never: Collection[str]
) -> tuple[bool, bool]:
    """Whether one result holds a quorum of ``roster`` now, and whether one (or a result only the
    peers yet to report would hold) can still reach one."""
    members = members_of(reports, roster)
    holders: dict[str, set[str]] = {}
    for peer, report in reports.items():
        if report.ok and peer in members:
            holders.setdefault(report.digest, set()).add(peer)
    held = any(is_quorum(h, members) for h in holders.values())
    undecided = members - reports.keys() - set(never)
    return held, any(is_quorum(h | undecided, members) for h in [*holders.values(), set()])


@dataclass(frozen=True)
class CommittedState:
    """The state a quorum holds after a committed attempt, and the peers that reported holding it."""

    attempt: int
    digest: str  # of the state (parameters and optimizer state), not of the averaged result
    holders: tuple[str, ...]


def newest_committed_state(
    board: CommitBoard,
    roster: Collection[str],
    lookback: int = 8,
    latest: int | None = None,
    any_holder: bool = False,
) -> CommittedState | None:
    """The newest state of the last ``lookback`` attempts that a quorum of ``roster`` reports holding
    after committing one result (None: none): what a peer that fell behind loads, and from whom. The
    digest is the majority's word, not one server's. ``latest``: the board's latest attempt, if the
    caller just read it. ``any_holder``: the newest state any roster peer reports, quorum or not (an
    outer task's cohort that split), the same choice for every reader (the smallest holder's)."""
    if latest is None:
        latest = board.latest_attempt()
    for attempt in range(latest, max(-1, latest - lookback), -1):
        state = state_in(attempt, board.read(attempt), roster, any_holder)
        if state is not None:
            return state
    return None


def state_in(
    attempt: int, reports: Reports, roster: Collection[str], any_holder: bool = False
) -> CommittedState | None:
    """The state a quorum of ``roster`` reports holding in ``attempt``'s ``reports`` (None: none);
    ``any_holder`` as for :func:`newest_committed_state`."""
    members = members_of(reports, roster)
    by_state: dict[tuple[str, str], set[str]] = {}
    for p, r in reports.items():
        if r.ok and r.state:
            by_state.setdefault((r.digest, r.state), set()).add(p)
    for (_result, state), peers in by_state.items():
        if is_quorum(peers, members):
            ordered = sorted(peers, key=lambda p: (p not in members, p))  # online ones first
            return CommittedState(attempt, state, tuple(ordered))
    held = sorted(
        (min(peers & members), state, peers) for (_r, state), peers in by_state.items() if peers & members
    )
    if any_holder and held:
        _first, state, peers = held[0]
        return CommittedState(attempt, state, tuple(sorted(peers, key=lambda p: (p not in members, p))))
    return None
