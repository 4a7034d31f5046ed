"""Which round the aggregator's desk takes the swarm to be in, from peers' signed progress records on
a real DHT: a liar's far-off round, alone on the board, must not push every honest receipt out of
the window (the red team's rogue-progress peer once made it refuse a whole round's receipts)."""

from __future__ import annotations

from aggregator.contributions import ContributionDesk
from hivemind_adapter.p2p import Endpoint
from peer.swarm_view import ProgressBoard
from protocol.identity import Identity
from tests.helpers import two_task_dhts, wait_until
from tests.protocol.factories import TASK, fake_peer_id, task_spec


def test_a_lone_far_off_progress_record_sets_the_round_only_in_a_swarm_of_two(tmp_path):
    aggregator = Identity.generate()
    with two_task_dhts(TASK) as (first, second):
        desk = ContributionDesk(
            first, Endpoint(first, "desk"), aggregator, task_spec(aggregator), tmp_path / "l.sqlite"
        )
        try:
            liar = ProgressBoard(second, TASK, Identity.generate(), fake_peer_id(b"liar"))
            assert liar.publish(10**9, 64, 1.0, 1.0, "cohort-a", 10**9 - 1)
            wait_until(lambda: desk._swarm_round(announced=2) == 10**9, 15, "the desk to read the record")
            assert desk._swarm_round(announced=6) == -1  # the roster holds others: one record is one word
            assert desk._swarm_round(announced=0) == -1  # the roster read failed: no word stands alone
            honest = ProgressBoard(second, TASK, Identity.generate(), fake_peer_id(b"honest"))
            assert honest.publish(5, 64, 1.0, 1.0, "cohort-a", 4)
            wait_until(lambda: desk._swarm_round(announced=6) == 5, 15, "the desk to read both records")
        finally:
            desk.shutdown()
