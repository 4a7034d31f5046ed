"""A leaving peer leaves the state it ends on with the aggregator (peer/state_handoff.py,
aggregator/state_handoff.py): real console scripts, a real aggregator and its checkpoint files."""

from __future__ import annotations

import pytest

from testbed.local_swarm import LocalSwarm, SwarmOptions
from tests.helpers import run_swarm_to_end

pytestmark = pytest.mark.swarm

SMALL = dict(target_samples=96, batch_size=32, subnets=2, width_mult="0.25", head_channels=64)


def test_the_aggregator_checkpoints_the_round_its_peers_left_on_though_it_fetched_no_state_before(tmp_path):
    """With audits off the aggregator prefetches no state, and no periodic checkpoint is due: the
    round the peers end on reaches its final checkpoint only because each peer, leaving, handed it
    over and kept serving it until the aggregator held it."""
    swarm = LocalSwarm(SwarmOptions(peers=2, rounds=3, run_dir=tmp_path, **SMALL))
    run_swarm_to_end(swarm, timeout=300, checkpoint_every=3600, extra_args=("--audit-fraction", "0"))
    last = max(r["round"] for i in range(2) for r in swarm.rounds(i) if r["committed"])
    aggregator = swarm.dir / "aggregator"
    log = (aggregator / "log.txt").read_text()
    assert f"final checkpoint: round {last} written to " in log, log[-3000:]
    assert [p.name for p in sorted((aggregator / "checkpoints").glob("round-*.pt"))] == [
        f"round-{last:08d}.pt"
    ]
    for i in range(2):
        peer_log = (swarm.peer_dir(i) / "log.txt").read_text()
        assert f"(round {last}) to aggregator " in peer_log and ": held there" in peer_log, peer_log[-2000:]
