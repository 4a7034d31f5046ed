"""The aggregator's checkpoint keeper on a real DHT: when an outer task's state is worth a checkpoint
at once (its holders serve it only briefly after its period ends), and what the last checkpoint of a
stopping aggregator says when it writes none (the one it writes: tests/peer/test_swarm_training.py)."""

from __future__ import annotations

from aggregator.checkpoints import CheckpointKeeper
from hivemind_adapter.p2p import Endpoint
from supernet.state import digest
from supernet.workload import workload_for
from tests.helpers import two_task_dhts
from tests.protocol.factories import TASK

SMALL = dict(seed=0, batch_size=32, num_subnets=2, width_mult=0.25, head_channels=64, total_steps=4)


def test_an_outer_tasks_period_end_state_wakes_the_checkpoint_loop(tmp_path):
    # The state after a period's end is learned only when the next round's receipts close, and its
    # holders move on soon after: a checkpoint that waited for the loop's next tick (10 s) missed it
    # when the run ended first (the 2-site outer test, one run of three once peers left faster).
    with two_task_dhts(TASK) as (first, _):
        endpoint = Endpoint(first, "keeper")
        keeper = CheckpointKeeper(
            first, endpoint, TASK, workload_for("digits", SMALL), tmp_path / "ckpt", outer_period=2
        )
        try:
            keeper.learn(0, "ab" * 32, [])  # a round inside the period: the tick will do
            assert not keeper.period_end_learned.is_set()
            keeper.learn(1, "cd" * 32, [])  # the period's last round
            assert keeper.period_end_learned.is_set()
        finally:
            keeper.shutdown()
            endpoint.close()


def test_an_every_step_task_leaves_its_checkpoints_to_the_loops_tick(tmp_path):
    # every round's state is checkpointable there; waking for each would fetch and write every round
    with two_task_dhts(TASK) as (first, _):
        endpoint = Endpoint(first, "keeper")
        keeper = CheckpointKeeper(first, endpoint, TASK, workload_for("digits", SMALL), tmp_path / "ckpt")
        try:
            keeper.learn(1, digest(keeper.template[: keeper.consensus]), [])
            assert not keeper.period_end_learned.is_set()
        finally:
            keeper.shutdown()
            endpoint.close()


def test_the_final_checkpoint_says_in_one_line_why_it_wrote_none(tmp_path):
    with two_task_dhts(TASK) as (first, _):
        endpoint = Endpoint(first, "keeper")
        keeper = CheckpointKeeper(first, endpoint, TASK, workload_for("digits", SMALL), tmp_path / "ckpt")
        try:
            assert keeper.final_checkpoint(1.0) == "none written: no committed state was heard of"
            keeper.learn(3, "ab" * 32, [])  # committed, but nobody is known to hold it
            assert keeper.final_checkpoint(1.0) == (
                "none written: the state of round 3 could not be had from its holders within 1 s "
                "(newest checkpoint: none)"
            )
            assert not (tmp_path / "ckpt").exists()
        finally:
            keeper.shutdown()
            endpoint.close()
