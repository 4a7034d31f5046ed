"""An aggregator restarted on an older copy of its ledger refuses to start: the DHT still holds the
checkpoint it published (peers hold inclusion proofs against it), and the copy does not extend it.
Real DHT nodes, real SQLite ledger files, real signatures."""

from __future__ import annotations

import shutil

import pytest

from aggregator.contributions import ContributionDesk, LedgerBehind
from aggregator.desk_network import published_head
from hivemind_adapter.p2p import Endpoint
from protocol.identity import Identity
from tests.helpers import two_task_dhts, wait_until
from tests.protocol.factories import TASK, sealed_receipt, task_spec


def _desk(dht, aggregator: Identity, path):
    endpoint = Endpoint(dht, "desk")
    try:
        return ContributionDesk(dht, endpoint, aggregator, task_spec(aggregator), path), endpoint
    except Exception:
        endpoint.close()
        raise


def _append_and_publish(desk: ContributionDesk, peer: Identity, round_: int) -> int:
    batch = [sealed_receipt(peer, round_ + 1, round=round_)]
    checkpoint = desk._ledger.run(lambda store: store.append_batch(batch, desk.identity))
    desk._publish_checkpoint(checkpoint.note)
    return checkpoint.checkpoint.size


def test_an_aggregator_on_an_older_copy_of_its_ledger_refuses_to_start(tmp_path):
    aggregator, peer = Identity.generate(), Identity.generate()
    ledger, older = tmp_path / "ledger.sqlite", tmp_path / "older.sqlite"
    with two_task_dhts(TASK) as (dht, _):
        desk, endpoint = _desk(dht, aggregator, ledger)
        _append_and_publish(desk, peer, 0)
        desk.shutdown()
        endpoint.close()
        shutil.copy(ledger, older)  # the operator's backup, one batch old
        desk, endpoint = _desk(dht, aggregator, ledger)
        size = _append_and_publish(desk, peer, 1)
        wait_until(lambda: (h := published_head(dht, aggregator, TASK)) is not None and h.size == size, 15,
                   "the newer checkpoint in the DHT")  # fmt: skip
        desk.shutdown()
        endpoint.close()
        with pytest.raises(LedgerBehind, match="fewer than the 2 of the pinned checkpoint"):
            _desk(dht, aggregator, older)
        desk, endpoint = _desk(dht, aggregator, ledger)  # the newer one starts
        desk.shutdown()
        endpoint.close()
