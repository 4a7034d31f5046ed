"""When one averaging attempt's result becomes the swarm's: digests on a board, and a quorum.

After its stages every participant posts the digest of its result (or a failure) under the attempt.
A peer commits its result once the peers that posted *the same digest* are more than half of its
roster (the peers online when the round began, less those that posted a departure notice for the
attempt). Two such majorities share a peer, and a peer posts one digest per attempt, so at most one
result of an attempt can commit, even when the swarm split into groups that never met. Nobody waits
for the peers outside that majority: a peer that died, stalled or never averaged costs only its own
contribution. A peer whose result does not reach a majority keeps its previous values, and the round
loop then catches it up from the peers that committed (its stale state also keeps it out of their
next groups, which are keyed by state).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from hivemind_adapter.dht import peer_id, read_entries, store
from protocol.proof_attestation import Equivocation, find_equivocation, parse_tokens

logger = logging.getLogger(__name__)

COMMIT_POLL_SECONDS = 0.1  # how often a peer re-reads the board while it waits for a quorum
NEVER_POLL_SECONDS = 2.0  # how often it asks which roster peers will never report (a roster read)
# Once its result holds a quorum, how long a peer still waits for the reports of the other contributors
# to it (their proof attestations may show that a reducer told them a different story). Honest ones
# post within a poll or two of each other; a silent one costs every round at most this.
WITNESS_GRACE_SECONDS = 2.0


@dataclass(frozen=True)
class PostedChecks:
    """What one peer's latest record of an attempt says about the groups of three it checked."""

    tokens: frozenset[str]  # :func:`protocol.averaging_group.stage_check_token` of each
    marker: bool  # only a marker: the peer has not reported the attempt yet
    proofs: tuple[str, ...] = ()  # the proof attestations it accepted so far (markers carry them too)
    refused: frozenset[str] = frozenset()  # reducers whose averages it refused in the attempt


@dataclass(frozen=True)
class PartnersChecked:
    """How the wait for a group of three's confirmations ended."""

    confirmed: bool
    reason: str = ""  # why not, if not
    equivocation: Equivocation | None = None  # a reducer's two signed, different proofs, if posted


class CommitBoard(Protocol):
    """Where participants post and read their end-of-attempt reports."""

    peer_id: str  # whose reports :meth:`post` writes

    def post(
        self,
        attempt: int,
        ok: bool,
        digest: str,
        left: bool = False,
        state: str = "",
        wait: bool = True,
        group: str = "",
        outliers: Sequence[str] = (),
        proofs: Sequence[str] = (),
        checked: Sequence[str] = (),
        checking: bool = False,
        refused: Sequence[str] = (),
    ) -> None:
        """``left``: a departure notice for ``attempt`` (not an attempt run; see :meth:`latest_attempt`).
        ``state``: the state digest after committing ``digest`` (the same report, posted again).
        ``wait=False``: return while the DHT still stores it (a later report of the same attempt
        replaces an earlier one whichever lands first: it expires later). ``group``: the averaging
        group id of the result (:class:`protocol.records.RoundCommit`), what receipts are checked
        against; ``outliers``: the peers this peer's reducers named; ``proofs``: the reducers' signed
        digests of the proofs it accepted (:mod:`protocol.proof_attestation` tokens); ``checked``: the
        tokens of the groups of three it checked (:func:`await_partners_checked`), which every later
        report of the attempt repeats; ``checking``: a marker that carries only those (and
        ``refused``, the reducers whose averages it refused in the attempt), not a report."""
        ...

    def read(self, attempt: int) -> dict[str, dict]:
        """peer id -> {"ok": bool, "digest": str, "left": bool, "state": str} for every report of
        ``attempt`` seen (markers aside: a peer that posted only a marker has not reported)."""
        ...

    def read_checks(self, attempt: int) -> dict[str, PostedChecks]:
        """peer id -> the checks its latest record of ``attempt`` lists, marker or report."""
        ...

    def latest_attempt(self, peers: Collection[str] | None = None) -> int:
        """The highest attempt anyone (of ``peers``, if given) reported recently, departure notices
        and checking markers aside (-1 if none): where the swarm (or those peers) last ended an
        attempt. A marker is posted in the middle of an attempt: counted, it ended a newcomer's
        sit-out before the attempt's commit, and sent a peer that fell behind one attempt past the
        one the swarm runs (measured: the red team's late joiner, one attempt ahead of the swarm in
        each of its 4 rounds, none committed)."""
        ...


class DHTCommitBoard:
    """An unsigned board under ``{run_id}_commits`` (subkey ``<attempt>/<peer id>``), for swarms whose
    peers trust each other (tests, benchmarks). MANTA peers use the signed board of
    :mod:`peer.swarm_view` instead."""

    def __init__(self, dht, run_id: str, ttl: float = 60.0):
        self.dht, self.key, self.ttl = dht, f"{run_id}_commits", ttl
        self.peer_id = peer_id(dht)

    def post(
        self,
        attempt: int,
        ok: bool,
        digest: str,
        left: bool = False,
        state: str = "",
        wait: bool = True,
        group: str = "",
        outliers: Sequence[str] = (),
        proofs: Sequence[str] = (),
        checked: Sequence[str] = (),
        checking: bool = False,
        refused: Sequence[str] = (),
    ) -> None:
        value = {"ok": ok, "digest": digest, "left": left, "state": state, "group": group}
        if outliers:
            value["outliers"] = list(outliers)
        if proofs:
            value["proofs"] = list(proofs)
        if checked or checking:
            value.update(checked=list(checked), checking=checking, refused=list(refused))
        store(self.dht, self.key, value, self.ttl, subkey=f"{attempt}/{self.peer_id}", wait=wait)

    def _entries(self) -> dict[tuple[int, str], dict]:
        out = {}
        for sub, value in read_entries(self.dht, self.key).items():
            attempt, _, peer = sub.partition("/")
            if attempt.isdigit() and isinstance(value, dict):
                out[int(attempt), peer] = value
        return out

    def read(self, attempt: int) -> dict[str, dict]:
        return {peer: r for (a, peer), r in self._entries().items() if a == attempt and not r.get("checking")}

    def read_checks(self, attempt: int) -> dict[str, PostedChecks]:
        return {
            peer: PostedChecks(
                frozenset(map(str, r.get("checked") or ())),
                bool(r.get("checking")),
                tuple(r.get("proofs") or ()),
                frozenset(map(str, r.get("refused") or ())),
            )
            for (a, peer), r in self._entries().items()
            if a == attempt
        }

    def latest_attempt(self, peers: Collection[str] | None = None) -> int:
        return max(
            (
                a
                for (a, p), r in self._entries().items()
                if not (r.get("left") or r.get("checking")) and (peers is None or p in peers)
            ),
            default=-1,
        )


def is_quorum(peers: Collection[str], roster: Collection[str]) -> bool:
    """Whether ``peers`` are more than half of ``roster``.

    A strict majority, not "half with a tie-break": peers read the roster at slightly different
    times, and strict majorities of two rosters that differ by one peer (a joiner or a leaver seen by
    some peers only) still always share a peer; tie-broken halves do not."""
    members = set(roster)
    return 2 * len(set(peers) & members) > len(members)


@dataclass(frozen=True)
class CommitDecision:
    committed: bool
    reason: str = ""
    agreeing: int = 0  # peers that posted this peer's digest when it decided
    timed_out: bool = False  # undecided when the wait ended (not: decided against this result)
    seen: frozenset[str] = frozenset()  # the peers that had posted anything for the attempt, last read
    equivocation: Equivocation | None = None  # a reducer's two signed, different proofs, if posted


def await_commit(
    board: CommitBoard,
    attempt: int,
    digest: str,
    roster: Collection[str],
    deadline_seconds: float,
    never: Callable[[], Collection[str]] | None = None,
    public_keys: Mapping[str, str] | None = None,
    witnesses: Collection[str] = (),
) -> CommitDecision:
    """Wait (at most ``deadline_seconds``) until the peers that posted ``digest`` for ``attempt`` are
    a quorum of ``roster``. Gives up early once that can no longer happen (too many roster peers
    posted a failure or another digest). This peer's own report must already be on the board.

    Never commits while the reports hold a reducer's equivocation (:func:`equivocation_in`, its
    signatures checked under ``public_keys``): a reducer that sent members different proofs can
    have passed any result. ``witnesses`` (the other contributors to this result, every member of
    its all-reduces) are the peers whose attestations show one: once the quorum holds, it waits
    :data:`WITNESS_GRACE_SECONDS` more for those that have not posted yet.

    ``never`` (asked every :data:`NEVER_POLL_SECONDS`): roster peers that will not report for ``attempt``
    (gone from the roster: dead or cut off). They only hasten giving up: a result
    still commits only with a strict majority of the whole roster, so two peers that see different
    peers gone can never commit different results; without them, a peer left alone by deaths waited
    out the whole commit deadline (40-66 s on the churn benchmark)."""
    deadline = time.monotonic() + deadline_seconds
    gone = _Throttled(never)
    witnessed_by: float | None = None  # when the quorum held: the wait for witnesses ends then
    while True:
        reports = board.read(attempt)
        # A peer that announced its departure from this attempt never posts a result for it, so
        # leaving it out of the roster cannot make two results quorums (they still share a peer).
        members = set(roster) - {p for p, r in reports.items() if r.get("left")}
        agreeing = {p for p, r in reports.items() if r.get("ok") and r.get("digest") == digest}
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
            time.sleep(COMMIT_POLL_SECONDS)
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
        time.sleep(COMMIT_POLL_SECONDS)


def await_partners_checked(
    board: CommitBoard,
    attempt: int,
    token: str,
    partners: Collection[str],
    deadline_seconds: float,
    never: Callable[[], Collection[str]] | None = None,
    public_keys: Mapping[str, str] | None = None,
) -> PartnersChecked:
    """Wait (at most ``deadline_seconds``) until every one of ``partners`` lists ``token`` (this
    peer's :func:`~protocol.averaging_group.stage_check_token` of an all-reduce they shared) in its
    record of ``attempt``. Confirmed once they all do; otherwise ends as soon as it is known that
    they will not: a partner reported the attempt (a failure, a departure, a result) without it, or
    left the roster (``never``), or refused the averages of a member of the group (its marker says
    so as soon as its all-reduce broke on them), or the records show a reducer's equivocation (the proof
    attestations that markers carry, signatures under ``public_keys``: a reducer that sent members
    different results gives them different tokens, and only this shows why), or the wait ran out.
    This peer's own marker must already be posted.

    Why, in groups of three: a reducer that holds one member's results back until the others are
    done can list that member's entry anywhere in its proof, since nobody else checks it; there it
    balances a lie that the one member left has no second honest part to measure by
    (:mod:`robust_aggregation.reducer_proof`, point 6). Once that member's report counts toward a
    quorum, deciding otherwise later changes nothing (:func:`commit_pending` commits it anyway), so
    the agreement comes first: nobody goes on until both partners say they received and checked the
    same result. The held-back member's marker names the reducer it refused (or it reports a
    failure, or nothing), and the lie goes no further. A partner whose marker lists another result
    is waited out, unless the markers' attestations show the reducer's two stories."""
    deadline = time.monotonic() + deadline_seconds
    gone = _Throttled(never)
    while True:
        checks = board.read_checks(attempt)
        posted_proofs = ((p, parse_tokens(c.proofs)) for p, c in sorted(checks.items()))
        if (equivocation := find_equivocation(posted_proofs, public_keys)) is not None:
            return PartnersChecked(False, equivocation.describe(), equivocation)
        group = set(partners) | {board.peer_id}
        for partner in sorted(partners):
            posted = checks.get(partner)
            if posted is not None and (refused := sorted(posted.refused & (group - {partner}))):
                # it refused a member's averages in this attempt and never meets it again in it
                return PartnersChecked(
                    False, f"{partner[-8:]} refused the averages of {', '.join(p[-8:] for p in refused)}"
                )
        waiting = []
        for partner in sorted(partners):
            posted = checks.get(partner)
            if posted is not None and token in posted.tokens:
                continue
            if posted is not None and not posted.marker:
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
        time.sleep(COMMIT_POLL_SECONDS)


def await_quorum_reports(
    board: CommitBoard,
    attempt: int,
    roster: Collection[str],
    deadline_seconds: float,
    never: Callable[[], Collection[str]] | None = None,
) -> bool:
    """Wait (at most ``deadline_seconds``) until a quorum of ``roster`` posted anything for ``attempt``
    (a result, a failure or a departure), or is done with it otherwise (``never``: gone from the
    roster). A peer whose attempt failed early waits here before its next round: the others
    are still in this attempt, and meeting them in the next one needs them there (and the state they
    commit now is what it must catch up with). Returns whether they did."""
    done = _Throttled(never)
    return _poll(lambda: is_quorum(set(board.read(attempt)) | done(), roster), deadline_seconds)


class _Throttled:
    """``never()``, asked at most every :data:`NEVER_POLL_SECONDS` (it reads the roster), first after that long (most waits end sooner); the last answer in between."""

    def __init__(self, never: Callable[[], Collection[str]] | None):
        self.never, self.last, self.at = never, set(), time.monotonic()

    def __call__(self) -> set[str]:
        if self.never is not None and time.monotonic() - self.at >= NEVER_POLL_SECONDS:
            self.last, self.at = set(self.never()), time.monotonic()
        return self.last


def _poll(condition: Callable[[], bool], deadline_seconds: float) -> bool:
    """Re-check ``condition`` every :data:`COMMIT_POLL_SECONDS` until it holds (True) or
    ``deadline_seconds`` passed (False)."""
    deadline = time.monotonic() + deadline_seconds
    while True:
        if condition():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(COMMIT_POLL_SECONDS)


def equivocation_in(reports: dict[str, dict], public_keys: Mapping[str, str] | None) -> Equivocation | None:
    """A reducer's equivocation among the proof attestations that ``reports`` carry (signatures
    checked under ``public_keys``; None: compared as posted, a swarm whose peers trust each other)."""
    posted = ((peer, parse_tokens(report.get("proofs") or ())) for peer, report in sorted(reports.items()))
    return find_equivocation(posted, public_keys)


def result_holds_quorum(reports: dict[str, dict], roster: Collection[str], digest: str) -> bool:
    """Whether the peers that posted result ``digest`` in ``reports`` are a quorum of ``roster`` (less
    the peers that posted a departure notice for the attempt): the rule every commit follows."""
    members = set(roster) - {p for p, r in reports.items() if r.get("left")}
    agreeing = {p for p, r in reports.items() if r.get("ok") and r.get("digest") == digest}
    return bool(digest) and is_quorum(agreeing, members)


def attempt_decided(
    reports: dict[str, dict], roster: Collection[str], never: Collection[str] = frozenset()
) -> bool:
    """Whether an attempt's outcome is settled, from its ``reports``: one result holds a quorum of
    ``roster`` (its holders commit it now), or no result can reach one any more, not even one that
    only the peers yet to report would hold (everyone who posted a result then gives up now).
    ``never``: roster peers that will not report (gone from the roster)."""
    members = set(roster) - {p for p, r in reports.items() if r.get("left")}
    holders: dict[str, set[str]] = {}
    for peer, report in reports.items():
        if report.get("ok") and peer in members:
            holders.setdefault(str(report.get("digest")), set()).add(peer)
    if any(is_quorum(h, members) for h in holders.values()):
        return True
    undecided = members - reports.keys() - set(never)
    return not any(is_quorum(h | undecided, members) for h in [*holders.values(), set()])


def await_attempt_decided(
    board: CommitBoard,
    attempt: int,
    roster: Collection[str],
    deadline_seconds: float,
    never: Callable[[], Collection[str]] | None = None,
) -> bool:
    """Wait (at most ``deadline_seconds``) until :func:`attempt_decided`. Returns whether it was."""
    done = _Throttled(never)
    return _poll(lambda: attempt_decided(board.read(attempt), roster, done()), deadline_seconds)


@dataclass(frozen=True)
class PostedResult:
    """What a peer's report of a result it posted for an attempt carries, all of which its state
    report (:func:`report_state`) must carry again, since it replaces that report: the group
    receipts name, the outliers the aggregator refuses, the proof attestations that late rechecks
    compare (:mod:`peer.conviction_watch`), the checks slow partners may still be reading."""

    digest: str
    group: str = ""
    outliers: tuple[str, ...] = ()
    proofs: tuple[str, ...] = ()
    checked: tuple[str, ...] = ()


def report_state(board: CommitBoard, attempt: int, result: PostedResult, state_digest: str) -> None:
    """After committing ``result`` of ``attempt`` and applying it: say which state this peer now holds
    (and serves), so peers catching up know whom to ask for it."""
    try:  # nobody waits for it: the DHT stores it while the next round computes
        board.post(
            attempt, True, result.digest, state=state_digest, wait=False, group=result.group,
            outliers=result.outliers, proofs=result.proofs, checked=result.checked,
        )  # fmt: skip
    except Exception as e:  # the DHT may be unreachable; catch-up then falls back to state sharing
        logger.debug(f"state report failed: {e}")


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
    after committing one result, or None: what a peer that fell behind should load, and from whom.
    The digest is the majority's word, not one server's. (Peers report their state a moment after
    the commit: until a quorum did, the attempt before it answers, and the next catch-up goes on.)
    ``latest``: the board's :meth:`~CommitBoard.latest_attempt`, if the caller just read it.
    ``any_holder``: the newest state any roster peer reports holding, quorum or not (an outer task's
    cohort that split: see :meth:`peer.node.PeerNode.catch_up`)."""
    if latest is None:
        latest = board.latest_attempt()
    for attempt in range(latest, max(-1, latest - lookback), -1):
        reports = board.read(attempt)
        members = set(roster) - {p for p, r in reports.items() if r.get("left")}
        by_state: dict[tuple[str, str], set[str]] = {}
        for p, r in reports.items():
            if r.get("ok") and r.get("state"):
                by_state.setdefault((r.get("digest", ""), r["state"]), set()).add(p)
        for (_result, state), peers in by_state.items():
            if is_quorum(peers, members):
                # Roster peers first: they are online; the others may have left since.
                ordered = sorted(peers, key=lambda p: (p not in members, p))
                return CommittedState(attempt, state, tuple(ordered))
        held = sorted(
            (min(peers & members), state, peers) for (_r, state), peers in by_state.items() if peers & members
        )
        if any_holder and held:
            # One choice for every peer that reads these reports (the state of the smallest peer id),
            # so two members holding different states of one attempt do not swap them.
            _first, state, peers = held[0]
            return CommittedState(attempt, state, tuple(sorted(peers, key=lambda p: (p not in members, p))))
    return None
