"""When a round's receipts are closed (aggregator/round_closing.py): two rounds behind the swarm only
once every member of each group it names has filed, else when its time is up. A real ledger file."""

from __future__ import annotations

from aggregator.intake import ContributionIntake, Submission
from aggregator.round_closing import RoundCloser
from ledger.store import LedgerStore
from protocol.averaging_group import group_membership
from protocol.identity import Identity
from protocol.records import ContributionReceipt
from protocol.sealing import seal
from tests.ledger.helpers import AGGREGATOR, ORIGIN
from tests.protocol.factories import TASK, group_fields, peer_id_of, receipt, task_spec


def _receipts_of_one_group(round_index: int) -> list[tuple[Submission, ContributionReceipt]]:
    """The receipts of both members of one two-member averaging group of ``round_index``, sealed."""
    members = [Identity.generate() for _ in range(2)]
    ids = [(peer_id_of(m), 64) for m in members]
    out = []
    for m in members:
        fields = group_fields(group_membership(ids, peer_id_of(m)))
        record = receipt(m, round_index, group_id="ab" * 16, samples=64, **fields)
        out.append((Submission(seal(record, m)), record))
    return out


def test_a_round_two_behind_the_swarm_waits_for_its_groups_last_receipt_unless_its_time_is_up(tmp_path):
    with LedgerStore.open(
        tmp_path / "l.db", create=True, origin=ORIGIN, log_public_key=AGGREGATOR.public_key
    ) as store:
        spec = task_spec(AGGREGATOR, task_id=TASK)
        closer = RoundCloser(
            ContributionIntake(store, AGGREGATOR, TASK), spec, close_after=20.0, round_window=20
        )
        first, second = _receipts_of_one_group(3)
        closer.add(*first)
        assert closer.due(swarm_round=9) == []  # the other member's receipt is still on its way
        assert closer.due(swarm_round=9, force=True) == [3]  # stopping: close what is here
        closer.add(*second)
        assert closer.due(swarm_round=4) == []  # complete, but the swarm may still be in it
        assert closer.due(swarm_round=5) == [3]
        # a member that never files: its round still closes once close_after has passed
        late = RoundCloser(
            ContributionIntake(store, AGGREGATOR, TASK), spec, close_after=0.0, round_window=20
        )
        alone, _ = _receipts_of_one_group(7)
        late.add(*alone)
        assert late.due(swarm_round=7) == [7]
