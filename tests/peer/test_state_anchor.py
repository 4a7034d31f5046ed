"""A state one node serves is loaded only on a quorum's or an aggregator's signed word: anchors are
read from the DHT, and one signed by any key the task does not list as an aggregator counts for
nothing (a forged one never even gets stored: every node's validator drops it)."""

from __future__ import annotations

import time

from hivemind_adapter.dht import dht_time
from peer.catch_up import anchored_digests
from protocol.dht_schema import anchor_key
from protocol.identity import Identity
from protocol.records import StateAnchor, seal
from tests.helpers import two_task_dhts
from tests.protocol.factories import task_spec

TASK = "digits-anchor-test"


def _anchor(identity: Identity, state_digest: str) -> bytes:
    record = StateAnchor(
        task_id=TASK, round=12, attempt=14, digest=state_digest, timestamp=int(time.time() * 1000)
    )
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
        assert anchored_digests(b, task) == {"aa" * 32}
