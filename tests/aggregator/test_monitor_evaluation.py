"""The monitor evaluates the newest checkpoint on the validation set, one at a time, within its duty."""

from __future__ import annotations

import pytest

from aggregator.monitor.evaluation import CheckpointEvaluator, checkpoint_round
from supernet.checkpoint import save_trained
from supernet.workload import workload_for
from tests.supernet.threads import single_torch_thread  # noqa: F401  (the evaluator sets 1 thread; restored after)

SMALL = dict(seed=0, batch_size=32, num_subnets=2, width_mult=0.25, head_channels=64, total_steps=4)


@pytest.fixture(scope="module")
def workload():
    return workload_for("digits", SMALL)


def test_the_newest_checkpoint_is_evaluated_once_and_within_the_duty_cycle(tmp_path, workload):
    net = workload.build()
    for round_index in (2, 5):
        save_trained(tmp_path / f"round-{round_index:08d}.pt", workload, net, round_index=round_index)
    results = []
    evaluator = CheckpointEvaluator(
        tmp_path, lambda r, res: results.append((r, res)), task=workload.task, duty=0.5
    )
    assert evaluator.poll() and not evaluator.poll()  # one evaluation at a time
    evaluator.wait(120)
    assert [r for r, _ in results] == [5]  # round 2 was skipped in favour of the newest
    result = results[0][1]
    assert result["metric"] == "accuracy" and result["higher_is_better"] is True
    assert 0.0 <= result["smallest"] <= 1.0 and 0.0 <= result["largest"] <= 1.0
    assert result["checkpoint"] == "round-00000005.pt" and result["seconds"] > 0
    assert not evaluator.poll()  # nothing newer
    save_trained(tmp_path / "round-00000006.pt", workload, net, round_index=6)
    assert not evaluator.poll()  # newer, but the last evaluation's duty-cycle pause is not over

    # An unreadable newest checkpoint is reported and not retried forever.
    (tmp_path / "round-00000009.pt").write_bytes(b"garbage")
    evaluator = CheckpointEvaluator(tmp_path, lambda r, res: results.append((r, res)), task=workload.task)
    assert evaluator.poll()
    evaluator.wait(60)
    assert "round-00000009.pt" in evaluator.last_error and len(results) == 1
    assert evaluator.newest_done == 9 and checkpoint_round(tmp_path / "round-00000009.pt") == 9
