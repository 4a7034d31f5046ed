"""Catching up with the swarm: the newest state a quorum committed, from every peer that holds it.

A peer that joins, or whose round failed, needs the state the others hold now. The commit board says
which state a majority of the roster holds after the last committed result, and who; every peer keeps
its recent committed states by digest (:mod:`hivemind_adapter.state_archive`). So the peer asks all
of those holders at once, a page each (:func:`hivemind_adapter.paged_blobs.fetch_spread`): on the
open internet a download is bounded by the server's uplink, and k holders serve it up to k times as
fast. What arrives must hash to the quorum's digest, not to a digest its server chose. When the board
knows no such state (the first peers of a run, or a run resumed from the aggregator's checkpoint
with no peer left), the newest state an aggregator of the task signed is fetched from the node its
anchor names (:func:`anchored_state`). A state one node serves is never loaded on that node's word,
and neither is the round it names (:func:`trusted_round`).

A newcomer that arrives while the swarm computes a round sits that attempt out and starts with the
next one (:func:`sit_out_running_attempt`): the others' rosters for it were read without the newcomer.
A peer found behind the swarm waits the same way until the attempt it left ended (:func:`await_attempt_end`).
Peers that start a run together begin once the roster stops changing (:func:`wait_for_settled_roster`).
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass

import torch

from hivemind_adapter.dht import read_signed
from hivemind_adapter.p2p import Endpoint
from hivemind_adapter.paged_blobs import BlobUnavailable
from hivemind_adapter.state_archive import fetch_state
from peer.commit.boards import CommitBoard
from peer.commit.quorum import (
    CommittedState,
    attempt_aborted,
    newest_committed_state,
    state_in,
)
from peer.commit.report import CommitReport
from protocol.dht_schema import anchor_key, open_anchor_value
from protocol.task_spec import TaskSpec

logger = logging.getLogger("manta.peer")

SIT_OUT_SECONDS = 180.0  # at most this long a newcomer waits for the attempt in progress to end
SIT_OUT_POLL_SECONDS = 0.5
# After the first result of the attempt sat out is posted: how long its committed state may take to show
# (a quorum's results, then their state reports) before an attempt no result can commit counts as aborted.
SIT_OUT_OUTCOME_SECONDS = 5.0
SIT_OUT_UNDECIDED_SECONDS = 60.0  # ... and at most this long while a result could still reach a quorum
SIT_OUT_ROSTER_SECONDS = 5.0  # how often that wait reads the roster (killed peers never report)
SIT_OUT_LOOKBACK = 8  # the most attempts that wait reads per poll
# A swarm between two rounds shows no fresh record of the next one for a moment: its peers publish
# within seconds of beginning it (PUBLISH_EVERY). A newcomer looks this long before taking it for idle.
SIT_OUT_SETTLE_SECONDS = 6.0
QUORUM_TIEBREAK = 1.0  # a quorum's result wins a tie against any one peer's (theirs are in (0, 0.5))
ANCHOR_TIEBREAK = 0.0  # an aggregator's state loses a tie against any peer's
PAGE_TIMEOUT = 30.0  # seconds for one page from one holder


def peer_tiebreak(peer_id: str) -> float:
    """A fixed number in [0, 0.5) per peer: orders peers that hold states of the same round."""
    return int(hashlib.sha256(peer_id.encode()).hexdigest()[:12], 16) / 16**12 / 2


@dataclass(frozen=True)
class SharedState:
    """A state as fetched (checked against its digest), with what ranks it against this peer's."""

    round: int  # the round it is the result of (-1: the initial state)
    digest: str
    attempt: int  # the averaging attempt that produced it
    tiebreak: float  # orders states of the same round (:data:`QUORUM_TIEBREAK`, a peer's own)
    tensors: list[torch.Tensor]


def committed_state(
    board: CommitBoard,
    roster: Collection[str],
    endpoint: Endpoint,
    task_id: str,
    template: list[torch.Tensor],
    consensus: int,
    own_digest: str,
    any_holder: bool = False,
) -> tuple[CommittedState | None, SharedState | None]:
    """``(newest, state)``: the newest state a quorum holds (None if the board knows none) and that
    state, fetched from its holders and checked against its digest (None if this peer already holds
    it, or no holder could serve it: the caller falls back to :func:`anchored_state`). ``any_holder``: see
    :func:`~peer.commit.quorum.newest_committed_state`."""
    result = newest_committed_state(board, roster, any_holder=any_holder)
    if result is None or result.digest == own_digest:
        return result, None
    try:
        got = fetch_state(endpoint, result.holders, task_id, result.digest, template, consensus, PAGE_TIMEOUT)
    except BlobUnavailable as e:
        logger.warning(f"the committed state {result.digest[:12]} could not be fetched from its holders: {e}")
        return result, None
    logger.debug(f"fetched state {result.digest[:12]} from {len(result.holders)} holder(s)")
    # The round number is its servers' word (the digest covers the tensors): they are a quorum's peers.
    return result, SharedState(got.round, got.digest, result.attempt, QUORUM_TIEBREAK, got.tensors)


def anchored_rounds(dht, task: TaskSpec) -> dict[str, int]:
    """The states the task's aggregators anchored (signed: the state of their newest checkpoint,
    :class:`protocol.records.StateAnchor`), digest -> the round the anchor says it is the result of;
    anchors signed by any other key are ignored."""
    found = read_signed(dht, anchor_key(task.task_id), lambda sub, v: open_anchor_value(task.task_id, sub, v))
    return {a.record.digest: a.record.round for a in found if task.signer_allowed(a.public_key)}


def anchored_state(
    dht, task: TaskSpec, endpoint: Endpoint, template: list[torch.Tensor], consensus: int, own_digest: str
) -> SharedState | None:
    """The newest state an aggregator of the task anchored (:func:`anchored_rounds`), fetched from
    the node its anchor names and checked against its digest, as the result of the round the anchor
    signed; None if none is anchored, it is this peer's own, or it could not be fetched."""
    found = read_signed(dht, anchor_key(task.task_id), lambda sub, v: open_anchor_value(task.task_id, sub, v))
    anchors = [a.record for a in found if task.signer_allowed(a.public_key)]
    if not anchors:
        return None
    newest = max(anchors, key=lambda a: (a.round, a.timestamp))
    if newest.digest == own_digest:
        return None
    try:
        got = fetch_state(
            endpoint, [newest.holder], task.task_id, newest.digest, template, consensus, PAGE_TIMEOUT
        )
    except BlobUnavailable as e:
        logger.warning(f"the anchored state {newest.digest[:12]} could not be fetched: {e}")
        return None
    return SharedState(newest.round, got.digest, newest.attempt, ANCHOR_TIEBREAK, got.tensors)


def trusted_round(served_as: int, anchored: int | None, swarm_round: int) -> int:
    """The round to take a downloaded state for, served as the result of round ``served_as``. Its
    digest covers the tensors, not the round its server wrote beside them: a holder could make a
    catching-up peer believe it is far ahead (its rounds, progress and receipts would then name
    rounds the swarm never ran). An anchored state is the round its aggregator signed. A quorum's
    state is the result of a round the swarm has begun, so never later than the latest round other
    peers show computing (``swarm_round``, corroborated; -1 when no record is fresh: then there is
    nothing to bound it by, and the servers' word stands)."""
    if anchored is not None:
        return anchored
    return served_as if swarm_round < 0 else min(served_as, swarm_round)


def swarm_runs_round(
    swarm_round: Callable[[], int],
    round_index: int,
    stop: threading.Event,
    settle: float = SIT_OUT_SETTLE_SECONDS,
) -> bool:
    """Whether other peers work on ``round_index`` or a later one (``swarm_round``: the latest round
    their fresh progress shows), looked at for up to ``settle`` seconds before answering no."""
    deadline = time.monotonic() + settle
    while swarm_round() < round_index:
        if stop.is_set() or time.monotonic() >= deadline:
            return False
        stop.wait(SIT_OUT_POLL_SECONDS)
    return True


def running_attempt(
    board: CommitBoard, others: Collection[str], online: Callable[[], Collection[str]] | None = None
) -> int:
    """The attempt the swarm is in: the latest one some peers ended, while its outcome is still to
    show (no quorum's state, and not aborted: the others are finishing it, and the next begins with
    a newcomer in every roster); else the one after it. ``online``: the roster's peers now (peers
    gone from it will not report)."""
    latest = board.latest_attempt()
    if latest < 0:
        return 0
    reports = board.read(latest)
    gone: frozenset[str] = frozenset()
    try:
        if online is not None:
            gone = frozenset(others) - frozenset(online())
    except Exception as e:  # a failed read proves nobody gone
        logger.debug(f"could not read the roster: {e}")
    if state_in(latest, reports, others) is None and not attempt_aborted(reports, others, gone):
        return latest
    return latest + 1


def sit_out_running_attempt(
    board: CommitBoard,
    others: Collection[str],
    stop: threading.Event,
    announce: Callable[[int], None] = lambda attempt: None,
    online: Callable[[], Collection[str]] | None = None,
    limit: float = SIT_OUT_SECONDS,
    outcome_grace: float = SIT_OUT_OUTCOME_SECONDS,
) -> int | None:
    """For a newcomer whose swarm is computing a round: sit out the attempt in progress. Returns that
    attempt (the caller takes part from the next one, after loading the state it committed), or None
    if the swarm has committed nothing yet. ``others`` is the roster without this peer (read once: the
    running attempt's rosters were fixed when it began); ``announce`` is told the attempt before the
    wait (to say so to the volunteer).

    Every peer reads its roster when its attempt begins, and only that roster counts for the commit
    quorum. A newcomer that joined an attempt begun before its announcement could be a contributor
    the others' quorum cannot count: landing in a cohort's group in place of a roster peer, or
    splitting the group in two, it would leave no result with a quorum, and the round would abort
    for everyone. Sitting out is safe either way: where a roster does hold this peer, its departure
    notice takes it out of that attempt's quorum. A swarm that has committed nothing is still
    forming (its first peers start together): everyone takes part at once.

    The wait is :func:`await_attempt_end` (``online``, ``limit`` and ``outcome_grace`` are its)."""
    if newest_committed_state(board, others) is None:
        return None
    running = running_attempt(board, others, online)
    try:
        board.post(running, CommitReport.departure())
    except Exception as e:  # the DHT may be unreachable; then the attempt we skip may wait for us
        logger.debug(f"departure notice failed: {e}")
    announce(running)
    await_attempt_end(board, others, running, stop, online, limit, outcome_grace)
    return running


def await_attempt_end(
    board: CommitBoard,
    others: Collection[str],
    attempt: int,
    stop: threading.Event,
    online: Callable[[], Collection[str]] | None = None,
    limit: float = SIT_OUT_SECONDS,
    outcome_grace: float = SIT_OUT_OUTCOME_SECONDS,
    undecided_grace: float = SIT_OUT_UNDECIDED_SECONDS,
) -> None:
    """For a peer that takes no part in ``attempt`` (its departure posted): wait until the swarm ended it.

    It ended when a quorum of ``others`` holds a state of it (or of a later attempt: a result that
    holds a quorum is waited on until its state does); or, once it has a result, when it aborted: no
    result holds a quorum nor can reach one (:func:`~peer.commit.quorum.attempt_aborted`; ``online``
    reads the roster's peers now, so that killed ones stop counting) and ``outcome_grace`` has passed:
    its peers start the next attempt now, and waiting for that one too would put this peer a whole
    attempt out of step. The wait also ends ``undecided_grace`` after the first result whatever the
    reports say (a late quorum can form tens of seconds after it), after ``limit`` seconds, or on
    ``stop``."""
    deadline, first_result = time.monotonic() + limit, None
    gone: frozenset[str] = frozenset()
    roster_read_at = float("-inf")
    while not stop.is_set() and time.monotonic() < deadline:
        latest = board.latest_attempt(near=attempt)
        # the attempt sat out and the newest ones after it, each read once per poll for both checks
        newest = max(latest, attempt)
        read = {a: board.read(a) for a in range(newest, max(attempt, newest - SIT_OUT_LOOKBACK) - 1, -1)}
        if any(state_in(a, reports, others) is not None for a, reports in read.items()):
            return
        now = time.monotonic()
        if first_result is None and latest >= attempt:
            first_result = now
        if first_result is not None:
            if now - first_result > undecided_grace:
                return
            if online is not None and now - roster_read_at >= SIT_OUT_ROSTER_SECONDS:
                gone, roster_read_at = frozenset(others) - frozenset(online()), now
            if now - first_result > outcome_grace and attempt_aborted(read[attempt], others, gone):
                return
        stop.wait(SIT_OUT_POLL_SECONDS)


LEAVE_WAIT_SECONDS = 30.0  # at most this long a leaving peer waits for the round the swarm is finishing
LEAVE_POLL_SECONDS = 1.0


def catch_up_before_leaving(
    catch_up: Callable[[], object],
    state_round: Callable[[], int],
    running_round: Callable[[], int],
    board: CommitBoard,
    stop: threading.Event,
    announce: Callable[[int], None] = lambda round_index: None,
    limit: float = LEAVE_WAIT_SECONDS,
    outcome_grace: float = SIT_OUT_OUTCOME_SECONDS,
    poll: float = LEAVE_POLL_SECONDS,
) -> int:
    """For a peer leaving on Ctrl-C: end on the state the swarm ends on. Returns the round of the state
    it ends on (``state_round()`` after the last ``catch_up()``).

    Peers stopped together (Ctrl-C to a local swarm, a site going down) meet the stop at different
    points of a round boundary: one whose last round aborted as it left, or that left just before the
    next round, while the others had begun that round and then finish it (that is what a stop asks
    of them). Each ends on a different state unless the early ones catch up. So a leaving peer first
    loads the newest state a quorum committed; if another peer still computes or averages a later round
    (``running_round``, from the progress board), it waits for that round: until it holds the round's
    state, until the attempt's first result is ``outcome_grace`` old and no report of it is a result
    (it aborted), until no fresh progress record shows the round any more, for at most ``limit`` seconds,
    or until ``stop`` (a second Ctrl-C). ``announce`` is told the round before the wait."""
    # Read first: a result posted at any moment after this counts as the running attempt's outcome
    # (read after the announcement, a result posted in between would be taken for an older attempt's).
    before = board.latest_attempt()  # the attempt the swarm committed or aborted last
    catch_up()
    target = running_round()
    if target <= state_round():
        return state_round()
    announce(target)
    deadline, first_result = time.monotonic() + limit, None
    while not stop.wait(poll) and time.monotonic() < deadline:
        catch_up()
        if state_round() >= target or running_round() < target:
            break
        latest = board.latest_attempt()
        if first_result is None and latest > before:
            first_result = time.monotonic()  # the running attempt's first result: its outcome is near
        if first_result is not None and time.monotonic() - first_result > outcome_grace:
            if any(r.ok for r in board.read(latest).values()):
                continue  # a result that may commit: its state reports follow it, within the limit
            catch_up()  # a state report that arrived within the grace
            break
    return state_round()


def wait_for_settled_roster(
    read: Callable[[], frozenset[str]], stop: threading.Event, settle: float, limit: float
) -> frozenset[str]:
    """Reads the roster (``read``: its peer ids) until it has not changed for ``settle`` seconds, at
    most ``limit`` seconds or until ``stop``; returns the last read. Peers that start together meet
    in their first round: one that read a partial roster plans other cohorts and a smaller quorum."""
    deadline = time.monotonic() + limit
    seen, since = read(), time.monotonic()
    while not stop.is_set():
        now = time.monotonic()
        if now - since >= settle or now >= deadline:
            break
        stop.wait(min(1.0, settle - (now - since), deadline - now))
        peers = read()
        if peers != seen:
            seen, since = peers, time.monotonic()
    return seen
