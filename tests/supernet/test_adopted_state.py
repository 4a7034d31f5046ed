"""A peer that loads a served state takes from the server only what the digest covers
(supernet/outer_state.py ``adopted_state``): a server that poisons the batch-norm statistics or an
outer task's anchor and residue changes nothing the peer loads. Real supernet state tensors."""

from __future__ import annotations

import torch

from supernet.outer_state import OuterState, adopted_state, served_consensus, served_layout, split_served
from supernet.state import consensus_count, digest, init_optimizer_state, state_tensors
from supernet.workload import workload_for

SMALL = dict(width_mult=0.25, head_channels=64, channel_divisor=4, batch_size=32, num_subnets=2)


def _state():
    workload = workload_for("digits", SMALL)
    net = workload.build()
    optimizer = workload.make_optimizer(net)
    init_optimizer_state(net, optimizer)
    params = len(list(net.parameters()))
    return (
        [t.detach().clone() for t in state_tensors(net, optimizer)],
        consensus_count(net, optimizer),
        params,
    )


def _poisoned(served: list[torch.Tensor], covered: int) -> list[torch.Tensor]:
    """``served`` with every tensor the digest does not cover replaced by huge values."""
    return [t if i < covered else torch.full_like(t, 1e30) for i, t in enumerate(served)]


def test_a_served_state_gives_only_its_digested_part_in_every_step_tasks():
    own, consensus, _ = _state()
    swarm = [t + 0.5 for t in own]  # the swarm moved on: other parameters, other BN statistics
    served = _poisoned(swarm, consensus)
    assert digest(served[:consensus]) == digest(swarm[:consensus])  # the digest cannot tell
    worker, outer = adopted_state(*split_served(served, consensus, len(own), 0), own, None, consensus, True)
    assert outer is None
    assert all(torch.equal(a, b) for a, b in zip(worker[:consensus], swarm[:consensus]))
    assert all(torch.equal(a, b) for a, b in zip(worker[consensus:], own[consensus:]))  # its own statistics


def test_an_outer_task_peer_keeps_its_anchor_and_residue_or_starts_a_period_never_takes_the_servers():
    own, consensus, params = _state()
    mine = OuterState.starting_at(own[:params])
    mine.residue = [torch.full_like(t, 0.25) for t in mine.residue]
    swarm = [t + 0.5 for t in own]
    theirs = OuterState(mine.global_params, mine.momentum, [t - 3 for t in own[:params]], mine.residue)
    served = served_layout(swarm, consensus, theirs)
    covered = served_consensus(consensus, theirs)
    poisoned = _poisoned(served, covered)
    split = split_served(poisoned, consensus, len(own), params)

    # its own cohort's state after the same outer step: its own anchor and residue
    worker, outer = adopted_state(*split, own, mine, consensus, True)
    assert all(torch.equal(a, b) for a, b in zip(outer.anchor, mine.anchor))
    assert all(torch.equal(a, b) for a, b in zip(outer.residue, mine.residue))
    assert all(torch.equal(a, b) for a, b in zip(worker[consensus:], own[consensus:]))

    # another cohort's, or after another outer step: a period that starts at the loaded parameters
    for own_cohort, own_outer in [
        (False, mine),
        (True, OuterState.starting_at([t + 1 for t in own[:params]])),
    ]:
        worker, outer = adopted_state(*split, own, own_outer, consensus, own_cohort)
        assert all(torch.equal(a, b) for a, b in zip(outer.anchor, swarm[:params]))
        assert all(not r.any() for r in outer.residue)
        assert all(torch.equal(a, b) for a, b in zip(outer.global_params, theirs.global_params))
