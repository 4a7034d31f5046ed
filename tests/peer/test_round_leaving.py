"""What a leaving peer keeps of its last round (peer.round.kept_when_leaving), and a peer behind the
swarm sitting an attempt out (peer.round.sit_out_behind) on a real DHT's commit board."""

from __future__ import annotations

import torch

from hivemind_adapter.dht import speaker
from peer.averaging.factory import committer_for
from peer.averaging.outcome import AveragingOutcome, Contributor
from peer.averaging.stage import AveragingTimeouts
from peer.commit.boards import SignedCommitBoard
from peer.commit.quorum import result_holds_quorum
from peer.commit.report import CommitReport
from peer.round import kept_when_leaving, sit_out_behind
from protocol.identity import Identity
from tests.helpers import two_task_dhts

ROSTER = ("peer-a", "peer-b", "peer-c")


def _committed(*peers: str) -> AveragingOutcome:
    return AveragingOutcome(
        committed=True,
        tensors=[torch.ones(3)],
        contributors=[Contributor(p, "rack", 8, "s0", False) for p in peers],
        digest="d1",
        seconds={"cohort": 0.2},
    )


def test_a_leaving_peer_drops_a_round_it_alone_would_hold():
    # Stopped together, the others finished their round; this one had begun the next and committed
    # it alone: keeping it would end the run on a state nobody else holds.
    kept = kept_when_leaving(_committed("peer-a"), ROSTER, "peer-a", leaving=True)
    assert not kept.committed and kept.tensors is None and "alone" in kept.reason
    assert kept.seconds == {"cohort": 0.2}


def test_otherwise_the_round_is_kept():
    shared = _committed("peer-a", "peer-b")
    assert kept_when_leaving(shared, ROSTER, "peer-a", leaving=True) is shared  # others hold it too
    alone = _committed("peer-a")
    assert kept_when_leaving(alone, ROSTER, "peer-a", leaving=False) is alone  # it stays: it is the swarm
    assert kept_when_leaving(alone, ("peer-a",), "peer-a", leaving=True) is alone  # a swarm of one
    aborted = AveragingOutcome(committed=False, reason="no quorum")
    assert kept_when_leaving(aborted, ROSTER, "peer-a", leaving=True) is aborted


def test_a_peer_behind_the_swarm_takes_itself_out_of_the_attempts_quorum():
    # Four roster peers; one computed an old round and cannot average. The other three commit only if
    # the quorum stops counting it: a result of 2 (the third's group broke) is no majority of 4, and
    # is one of the 3 that take part. 16 full peers with churn lost attempts so, as results of 7 of 14.
    task = "digits-behind-test"
    with two_task_dhts(task) as (first, second):
        behind_board = SignedCommitBoard(second, task, speaker(second, Identity.generate()))
        reader = SignedCommitBoard(first, task, speaker(first, Identity.generate()))
        outcome = sit_out_behind(committer_for(behind_board, AveragingTimeouts()), attempt=5, ahead=3)
        assert not outcome.committed and outcome.reason == "behind the swarm (it computes round 3)"
        digest = "cd" * 32
        reader.post(5, CommitReport(ok=True, digest=digest))
        reports = reader.read(5)
        assert reports.get(behind_board.peer_id) == CommitReport.departure()
        holders = {reader.peer_id: reports[reader.peer_id], "peer-b": CommitReport(ok=True, digest=digest)}
        roster = [reader.peer_id, behind_board.peer_id, "peer-b", "peer-c"]
        assert result_holds_quorum({**reports, **holders}, roster, digest)
        assert not result_holds_quorum(holders, roster, digest)  # without the notice: 2 of 4
