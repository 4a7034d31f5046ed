"""A peer that missed an outer step takes the outer state the others reached: who took the step, from
the signed outer board on a real DHT; their outer state, from a state one of them serves over real
libp2p; and the shift that keeps its own progress, through a real spawned worker's shared state."""

from __future__ import annotations

import pytest
import torch

from hivemind_adapter.dht import speaker
from hivemind_adapter.p2p import Endpoint
from hivemind_adapter.state_archive import StateArchive
from peer.averaging.factory import committer_for
from peer.averaging.stage import AveragingTimeouts
from peer.commit.boards import SignedCommitBoard
from peer.commit.report import CommitReport
from peer.outer_repair import missed_outer_state, takers_of
from peer.outer_round import OuterStepper
from peer.outer_step import OuterSettings
from protocol.dht_schema import outer_board_id
from protocol.identity import Identity
from supernet.outer_state import OuterState, outer_digest, served_consensus, served_layout
from supernet.state import digest
from tests.helpers import two_task_dhts, wait_until
from tests.peer.spawned_pool import spawned_pool

TASK = "digits-outer-repair-test"
OPTIONS = {"seed": 5, "batch_size": 16, "num_subnets": 2, "width_mult": 0.25, "head_channels": 64}


def test_the_peers_that_committed_an_outer_step_are_a_quorum_holding_one_result():
    with two_task_dhts(TASK) as dhts:
        me, other = (SignedCommitBoard(d, TASK, speaker(d, Identity.generate())) for d in dhts)
        roster = [me.peer_id, other.peer_id, "QmThirdPeerOfTheRoster"]
        assert takers_of(me, 2, roster, me.peer_id) == []  # nobody posted: nothing to take
        me.post(2, CommitReport(ok=True, digest="aa" * 32))  # this peer's own group's result
        other.post(
            2, CommitReport(ok=True, digest="bb" * 32)
        )  # and another group's: two cohorts that missed each other
        wait_until(lambda: len(me.read(2)) == 2, 15, "both posts to show", poll=0.2)
        # each "ok" says only that a group finished; neither result holds a quorum of 3: no step taken
        assert takers_of(me, 2, roster, me.peer_id) == []
        # with a roster of the two, neither holds more than half either; with the other alone, it does
        assert takers_of(me, 2, roster[:2], me.peer_id) == []
        other.post(3, CommitReport(ok=True, digest="cc" * 32))
        wait_until(lambda: other.read(3), 15, "the post to show", poll=0.2)
        assert takers_of(me, 3, roster[1:2], me.peer_id) == [other.peer_id]


def _outer(seed: int) -> OuterState:
    g = torch.Generator().manual_seed(seed)
    return OuterState(*([torch.randn(30, generator=g), torch.randn(4, 5, generator=g)] for _ in range(4)))


def test_the_outer_state_the_takers_serve_is_found_once_they_took_the_step():
    """One other peer took outer step 1 (a quorum of one other: one agreeing state suffices). While
    it still serves the outer state from before the step, there is nothing to take yet."""
    worker = [torch.randn(30), torch.randn(4, 5), torch.randn(30), torch.randn(4, 5)]  # params, optimizer
    layout = (len(worker), len(worker), 2)  # every worker tensor under the digest; 2 parameters
    mine = _outer(0)
    template = served_layout(worker, len(worker), mine)
    consensus = served_consensus(len(worker), mine)
    with two_task_dhts(TASK) as (their_dht, my_dht):
        them, me = Endpoint(their_dht, "them"), Endpoint(my_dht, "me")
        archive = StateArchive(them, TASK, head=2)
        boards = [SignedCommitBoard(d, TASK, speaker(d, Identity.generate())) for d in (their_dht, my_dht)]
        outer_boards = [
            SignedCommitBoard(d, outer_board_id(TASK), speaker(d, Identity.generate()))
            for d in (their_dht, my_dht)
        ]
        try:
            outer_boards[0].post(
                1, CommitReport(ok=True, digest="dd" * 32)
            )  # they committed outer exchange 1

            def serve(outer: OuterState, attempt: int) -> None:
                served = served_layout(worker, len(worker), outer)
                state_digest = digest(served[:consensus])
                archive.add(10 + attempt, attempt, state_digest, served, consensus)
                committer_for(boards[0], AveragingTimeouts()).report_state(
                    attempt, CommitReport(ok=True, digest="cc" * 32), state_digest
                )
                wait_until(lambda: boards[1].read(attempt), 15, "their state report to show", poll=0.2)

            def look() -> OuterState | None:
                return missed_outer_state(
                    outer_boards[1], boards[1], me, TASK, 1, [them.peer_id], me.peer_id, outer_digest(mine), template,
                    consensus, layout,
                )  # fmt: skip

            serve(mine, 3)  # overlapped, they take the step one period after the exchange
            assert look() is None
            reached = _outer(1)
            serve(reached, 4)
            found = look()
            assert found is not None and outer_digest(found) == outer_digest(reached)
            assert all(torch.equal(a, b) for a, b in zip(found.global_params, reached.global_params))
        finally:
            archive.close()
            them.close()
            me.close()


@pytest.fixture
def stepper(monkeypatch):
    monkeypatch.setenv("MANTA_WORKER_THREADS", "1")
    settings = OuterSettings(inner_steps=3, lr=0.7, momentum=0.9, compression="int8", overlap=True)
    with spawned_pool(OPTIONS, 5, "repair-test") as (pool, params):
        shared = pool.shared
        yield OuterStepper(
            settings, OuterState.starting_at(shared.state[:params]), pool, shared.state,
            len(shared.state), shared.state[params:], lambda _: None,
        ), shared  # fmt: skip


def test_a_missed_outer_step_moves_the_global_state_and_keeps_the_cohorts_own_progress(stepper):
    stepper, shared = stepper
    gen = torch.Generator().manual_seed(1)
    n = len(stepper.state.anchor)
    # this period's own progress: the cohort moved away from its anchor
    progress = [torch.randn(a.shape, generator=gen) * 0.01 for a in stepper.state.anchor]
    stepper._set_params([a - d for a, d in zip(stepper.state.anchor, progress)], fresh_optimizer=False)
    before = [p.clone() for p in shared.state[:n]]
    old_global = [g.clone() for g in stepper.state.global_params]
    # the step the others took, and the momentum it left
    step = [torch.randn(g.shape, generator=gen) * 0.05 for g in old_global]
    reached = [g + s for g, s in zip(old_global, step)]
    momentum = [torch.randn(g.shape, generator=gen) for g in old_global]
    old_digest = stepper.outer_digest()

    stepper.adopt_global(reached, momentum)

    assert stepper.outer_digest() == outer_digest(OuterState(reached, momentum, [], [])) != old_digest
    for now, was, s in zip(shared.state[:n], before, step):  # the workers' own buffers, shifted
        torch.testing.assert_close(now, was + s, rtol=0, atol=1e-6)
    for anchor, p, d in zip(stepper.state.anchor, stepper.params(), progress):  # progress kept whole
        torch.testing.assert_close(anchor - p, d, rtol=0, atol=1e-6)
    assert stepper.steps_adopted == 1 and stepper.steps_taken == 0
