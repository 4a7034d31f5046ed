"""What a leaving peer keeps of its last round (peer.round.kept_when_leaving)."""

from __future__ import annotations

import torch

from peer.averaging.outcome import AveragingOutcome, Contributor
from peer.round import kept_when_leaving

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
