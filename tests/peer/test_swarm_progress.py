"""What a peer reads of the swarm's progress on a real hivemind DHT: which round the others compute,
and which round they still work on once their computation is over and they average."""

from __future__ import annotations

import time

import pytest

from hivemind_adapter.dht import peer_id
from peer.swarm_progress import FRESH_MS, SwarmProgress
from peer.swarm_view import PROGRESS_TTL, ProgressBoard
from protocol.identity import Identity
from tests.helpers import two_task_dhts, wait_until

TASK = "digits-progress-test"


@pytest.fixture
def two_peers():
    with two_task_dhts(TASK) as dhts:
        yield [
            SwarmProgress(ProgressBoard(d, TASK, Identity.generate(), peer_id(d)), peer_id(d), 16, 1, 256)
            for d in dhts
        ]


def test_a_round_the_others_average_is_still_theirs_after_their_last_compute_record(two_peers):
    """A newcomer decides from this whether the swarm is busy with the round it would join: averaging
    over slow links can take longer than a compute record stays fresh."""
    worker, newcomer = two_peers
    assert newcomer.swarm_round() == -1  # nobody has published anything
    worker.begin(6, "cohort-a", state_round=5)
    worker.look(32, 1.0)  # publishes at once: its first record of round 6
    wait_until(lambda: newcomer.swarm_round() == 6, 15, "the newcomer to see round 6 computed", poll=0.2)
    worker.finish(48, 2.0)  # its computation is over; it averages now and publishes nothing more
    finished = time.monotonic()
    time.sleep(FRESH_MS / 1000 + 0.6 - (time.monotonic() - finished))  # + one read interval
    assert newcomer.swarm_round() == -1, "a record older than FRESH_MS still shows computing"
    assert newcomer.swarm_round(fresh_ms=int(PROGRESS_TTL * 1000)) == 6
    assert worker.swarm_round(fresh_ms=int(PROGRESS_TTL * 1000)) == -1  # a peer's own record never counts
