"""What an aggregator takes from a leaving peer's state hand-off (aggregator/state_handoff.py): only a
state the commit board names, of an attempt near the ones it read, fetched once. Real DHT nodes, a
real peer archive serving real states, the aggregator's real keeper (the whole swarm:
tests/peer/test_state_handoff.py)."""

from __future__ import annotations

import torch

from aggregator.checkpoints import CheckpointKeeper
from aggregator.commit_witness import CommitWitness
from aggregator.state_handoff import take_handoff
from hivemind_adapter.dht import peer_id, speaker
from hivemind_adapter.p2p import Endpoint
from hivemind_adapter.state_archive import StateArchive
from peer.commit.boards import SignedCommitBoard
from peer.commit.report import CommitReport
from protocol.averaging_group import averaging_group_id, group_membership
from protocol.identity import Identity
from protocol.state_handoff import StateHandoff
from supernet.state import digest
from supernet.workload import workload_for
from tests.helpers import two_task_dhts
from tests.protocol.factories import TASK

SMALL = dict(seed=0, batch_size=32, num_subnets=2, width_mult=0.25, head_channels=64, total_steps=4)
ATTEMPT = 9


def test_a_handoff_is_fetched_once_and_only_if_the_commit_board_names_its_state(tmp_path):
    with two_task_dhts(TASK) as (desk_dht, peer_dht):
        desk_end, peer_end = Endpoint(desk_dht, "desk"), Endpoint(peer_dht, "peer")
        keeper = CheckpointKeeper(desk_dht, desk_end, TASK, workload_for("digits", SMALL), tmp_path / "ckpt")
        archive = StateArchive(peer_end, TASK, head=1)
        try:
            consensus = keeper.consensus
            named, invented = (
                [t + shift if t.is_floating_point() else t.clone() for t in keeper.template]
                for shift in (0.5, 1.0)
            )
            named_digest, invented_digest = digest(named[:consensus]), digest(invented[:consensus])
            # the peer serves both; its commit report of ATTEMPT names only the first
            archive.add(4, ATTEMPT, named_digest, named, consensus)
            archive.add(4, ATTEMPT, invented_digest, invented, consensus)
            sender = peer_id(peer_dht)
            member = Identity.generate()
            membership = group_membership([(sender, 64)], sender)
            group = averaging_group_id(TASK, ATTEMPT, membership, "ab" * 32)
            board = SignedCommitBoard(peer_dht, TASK, speaker(peer_dht, member), ttl=60)
            board.post(ATTEMPT, CommitReport(ok=True, digest="ef" * 32, group=group).holding(named_digest))
            witness = CommitWitness(desk_dht, TASK)
            witness.read([ATTEMPT - 1])  # as a receipt of the attempt before would have

            def hand(attempt: int, state: str) -> dict:
                return take_handoff(StateHandoff(attempt, state).to_bytes(), sender, witness, keeper)

            # a state of the peer's own making: refused, nothing fetched
            refused = hand(ATTEMPT, invented_digest)
            assert refused["status"] == "rejected", refused
            assert (
                f"no commit report of attempt {ATTEMPT} names state {invented_digest[:12]}"
                in refused["detail"]
            )
            # an attempt far past any read is not read (it would push the real ones out of the window)
            assert hand(10**9, named_digest)["status"] == "rejected"
            assert witness.near(ATTEMPT) and not witness.holders_of(10**9, named_digest)
            assert keeper.fetched_bytes == 0
            # the state the board names: fetched from the peer, checked, held
            assert hand(ATTEMPT, named_digest) == {"status": "held"}
            fetched = keeper.fetched_bytes
            assert fetched == sum(t.numel() * t.element_size() for t in named)
            held = keeper.state_for(named_digest, timeout=1.0)
            assert held is not None and all(torch.equal(a, b) for a, b in zip(held, named))
            # every other leaving peer naming it costs no second fetch
            assert hand(ATTEMPT, named_digest) == {"status": "held"} and keeper.fetched_bytes == fetched
        finally:
            archive.close()
            keeper.shutdown()
            desk_end.close()
            peer_end.close()
