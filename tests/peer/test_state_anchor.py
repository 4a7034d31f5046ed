"""A state one node serves is loaded only on a quorum's or an aggregator's signed word: anchors are
read from the DHT, and one signed by any key the task does not list as an aggregator counts for
nothing (a forged one never even gets stored: every node's validator drops it). Nor is the round a
state is served as its server's word."""

from __future__ import annotations

import time

import torch

from hivemind_adapter.dht import dht_time
from hivemind_adapter.p2p import Endpoint
from hivemind_adapter.state_archive import StateArchive, fetch_state
from peer.catch_up import ANCHOR_TIEBREAK, anchored_rounds, anchored_state, trusted_round
from protocol.dht_schema import anchor_key
from protocol.identity import Identity
from protocol.records import StateAnchor
from protocol.sealing import seal
from supernet.state import digest
from tests.helpers import two_task_dhts
from tests.hivemind_adapter.archive_pair import archive_and_client
from tests.protocol.factories import peer_id_of, task_spec

TASK = "digits-anchor-test"


def _anchor(identity: Identity, state_digest: str, round_index: int = 12, holder: str | None = None) -> bytes:
    record = StateAnchor(
        task_id=TASK, round=round_index, attempt=14, digest=state_digest, timestamp=int(time.time() * 1000),
        holder=holder or peer_id_of(identity),
    )  # fmt: skip
    return seal(record, identity)


def test_only_the_tasks_aggregators_anchor_a_state():
    aggregator, volunteer = Identity.generate(), Identity.generate()
    task = task_spec(aggregator, TASK)
    with two_task_dhts(TASK) as (a, b):
        expires = dht_time() + 60
        for who, state_digest in ((aggregator, "aa" * 32), (volunteer, "bb" * 32)):
            assert a.store(anchor_key(TASK), _anchor(who, state_digest), expires, subkey=who.public_key_hex)
        # under another key's subkey: the validators refuse to store it at all
        assert not a.store(
            anchor_key(TASK), _anchor(volunteer, "cc" * 32), expires, subkey=aggregator.public_key_hex
        )
        assert anchored_rounds(b, task) == {"aa" * 32: 12}


def test_a_holder_cannot_move_the_round_of_the_state_it_serves():
    """The digest covers a state's tensors, not the round written beside them: a holder serving the
    committed state as the result of round 10^6 passes the digest check (the attack is real), and
    the peer takes it for the round its anchor signed or, for a quorum's state, no later round than
    the swarm is seen computing."""
    state = [torch.randn(300, 100, generator=torch.Generator().manual_seed(1)), torch.zeros(4)]
    state_digest = digest(state)
    with archive_and_client(TASK) as (archive, server, client):
        archive.add(10**6, 9, state_digest, state, len(state))  # the committed tensors, a forged round
        got = fetch_state(client, [server], TASK, state_digest, state, consensus=len(state))
    assert (got.round, got.digest) == (10**6, state_digest)
    assert trusted_round(got.round, anchored=None, swarm_round=7) == 7  # a quorum's state: bounded
    assert trusted_round(got.round, anchored=5, swarm_round=7) == 5  # an anchored one: the signed round
    assert trusted_round(6, anchored=None, swarm_round=7) == 6  # an honest round is kept
    # With no fresh progress record there is nothing to bound it by: the servers' word stands.
    assert trusted_round(got.round, anchored=None, swarm_round=-1) == 10**6


def test_a_peer_with_no_quorum_to_follow_loads_the_anchored_state_from_the_node_the_anchor_names():
    """A resumed run: no peer holds a committed state, the aggregator serves its checkpoint by digest
    and anchors it. A volunteer's anchor of a later round, served by the volunteer, is not taken."""
    aggregator, volunteer = Identity.generate(), Identity.generate()
    task = task_spec(aggregator, TASK)
    g = torch.Generator().manual_seed(2)
    checkpoint = [torch.randn(300, 100, generator=g), torch.randn(300, 100, generator=g), torch.zeros(4)]
    forged = [t + 1 for t in checkpoint]
    with two_task_dhts(TASK) as (agg_dht, peer_dht):
        agg_end, peer_end = Endpoint(agg_dht, "aggregator"), Endpoint(peer_dht, "peer")
        archive = StateArchive(agg_end, TASK, head=1)
        try:
            archive.add(30, 31, digest(checkpoint[:2]), checkpoint, 2)
            archive.add(99, 31, digest(forged[:2]), forged, 2)  # what the volunteer would serve
            expires = dht_time() + 60
            for who, state, round_index in ((aggregator, checkpoint, 30), (volunteer, forged, 99)):
                wire = _anchor(who, digest(state[:2]), round_index, holder=agg_end.peer_id)
                assert agg_dht.store(anchor_key(TASK), wire, expires, subkey=who.public_key_hex)
            got = anchored_state(
                peer_dht, task, peer_end, [torch.zeros_like(t) for t in checkpoint], 2, "00" * 32
            )
            assert got is not None and (got.round, got.digest) == (30, digest(checkpoint[:2]))
            assert got.tiebreak == ANCHOR_TIEBREAK and all(
                torch.equal(a, b) for a, b in zip(got.tensors, checkpoint)
            )
            # a peer that holds it already fetches nothing
            assert anchored_state(peer_dht, task, peer_end, checkpoint, 2, digest(checkpoint[:2])) is None
        finally:
            archive.close()
            peer_end.close()
            agg_end.close()
