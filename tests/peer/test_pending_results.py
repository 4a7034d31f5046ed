"""Aborted rounds whose posted result finds its quorum later (peer.round.committed_since), read from a
real signed commit board on a real hivemind DHT.

Run o of the churn benchmark: two peers gave up on attempt 8 and settled; the other cohort's head
posted the same result 15 s later and committed with them as its quorum. Looking once after the
settle was too early; a peer keeps the round's result and looks before each later round.
"""

from __future__ import annotations

import time

import pytest
import torch

from hivemind_adapter.dht import peer_id
from peer.hierarchy import AveragingOutcome
from peer.round import committed_since
from peer.round_types import Commitments, PendingResult, RoundPlan, RoundWork
from peer.swarm_view import SignedCommitBoard
from peer.worker_protocol import HostContribution
from protocol.identity import Identity
from tests.helpers import two_task_dhts

TASK = "digits-pending-test"


@pytest.fixture
def boards():
    with two_task_dhts(TASK) as dhts:
        yield [SignedCommitBoard(d, TASK, Identity.generate(), peer_id(d)) for d in dhts]


def _gave_up(
    attempt: int, roster: tuple[str, ...], result: str, tensors: list[torch.Tensor]
) -> PendingResult:
    plan = RoundPlan(3, attempt, "site-1", 0, 2, 2, roster)
    host = HostContribution(48, 2.3, 10_000, ("c0ffee",), 1.0, 0.8)
    outcome = AveragingOutcome(
        committed=False,
        reason="no quorum within 6 s",
        digest=result,
        pending=tensors,
        seconds={"cohort": 1.5},
    )
    work = RoundWork(plan, host, Commitments("ab" * 32, (1, 2), (48,)), "5a" * 32)
    return PendingResult(work, outcome, time.monotonic())


def test_a_result_whose_quorum_shows_after_the_settle_commits_before_the_next_round(boards):
    me, head = boards
    roster = (me.peer_id, head.peer_id, "QmKilledPeer")  # 2 of 3 is a quorum
    result, tensors = "5e" * 32, [torch.arange(3.0)]
    pending = [_gave_up(8, roster, result, tensors)]
    me.post(8, True, result)  # this peer's result; it gave up waiting and settled
    assert committed_since(pending, me, me.peer_id) is None  # 1 of 3: still nothing to commit
    head.post(8, True, result)  # the head's broadcast ended: its result, the same, makes the quorum
    found = committed_since(pending, me, me.peer_id)
    assert found is not None
    kept, outcome = found
    assert kept is pending[0] and outcome.committed and outcome.tensors is tensors and not outcome.reason
    assert outcome.seconds == {}  # its averaging time was counted when the round ended aborted


def test_only_the_posted_result_commits_and_the_newest_pending_round_is_taken_first(boards):
    me, head = boards
    roster = (me.peer_id, head.peer_id, "QmKilledPeer")
    older = _gave_up(8, roster, "5e" * 32, [torch.zeros(3)])
    newer = _gave_up(9, roster, "6f" * 32, [torch.ones(3)])
    me.post(8, True, "5e" * 32)
    head.post(8, True, "77" * 32)  # the head's result differs: attempt 8 has no quorum for ours
    assert committed_since([older, newer], me, me.peer_id) is None
    me.post(9, True, "6f" * 32)
    head.post(9, True, "6f" * 32)
    head.post(8, True, "5e" * 32)  # both would commit now: the newest attempt is the swarm's
    found = committed_since([older, newer], me, me.peer_id)
    assert found is not None and found[0] is newer
    # A larger roster makes 2 holders a minority: nothing commits.
    bigger = (*roster, "QmOther1", "QmOther2")
    assert committed_since([_gave_up(9, bigger, "6f" * 32, [torch.ones(3)])], me, me.peer_id) is None
