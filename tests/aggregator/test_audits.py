"""A spot audit replays a receipt with the very function the peer's workers ran: an honest receipt
passes (whatever happened to torch's generator in between, or happens in another thread meanwhile),
a fabricated or inflated one fails."""

from __future__ import annotations

import torch

from aggregator.audits import FAIL_BEYOND, Verdict, audit_receipt
from protocol.identity import Identity
from supernet.contribution import compute_contribution, contribution_sketch
from supernet.sketch import encode_sketch
from supernet.state import init_optimizer_state, state_tensors
from supernet.training.schedule import step_configs
from supernet.workload import workload_for
from tests.protocol.factories import peer_id_of, receipt
from tests.supernet.threads import (
    another_thread_reseeding_the_global_generator,
    single_torch_thread,  # noqa: F401
)

SEED, ROUND, PER_WORKER = 7, 3, 64


def _honest_receipt(workload, identity):
    """What a peer with two workers of PER_WORKER samples each commits to (as peer/worker.py and
    peer/node.py compute it), and the state it started from."""
    net = workload.build()
    optimizer = workload.make_optimizer(net)
    init_optimizer_state(net, optimizer)
    state = [t.detach().clone() for t in state_tensors(net, optimizer)]
    configs = step_configs(net, ROUND, workload.cfg)
    peer = peer_id_of(identity)
    total = None
    for worker in range(2):
        work = compute_contribution(
            workload, net, configs, "cpu", SEED, ROUND, f"{peer}/{worker}", go_on=lambda n: n < PER_WORKER
        )
        assert work.samples == PER_WORKER
        total = work.numerator if total is None else [a + b for a, b in zip(total, work.numerator)]
    sketch = encode_sketch(contribution_sketch(total, 2 * PER_WORKER, SEED, ROUND))
    honest = receipt(
        identity,
        ROUND,
        subnet_hashes=tuple(dict.fromkeys(c.hash for c in configs)),
        samples=2 * PER_WORKER,
        worker_samples=(PER_WORKER, PER_WORKER),
        grad_sketch=sketch,
    )
    return state, honest


def test_an_honest_receipt_passes_and_altered_ones_fail():
    workload = workload_for(
        "digits", dict(width_mult=0.25, head_channels=64, channel_divisor=4, batch_size=32, num_subnets=2)
    )
    identity = Identity.generate()
    state, honest = _honest_receipt(workload, identity)
    torch.manual_seed(12345)  # another thread's draws in between must not matter to the replay
    torch.rand(1000)
    result = audit_receipt(workload, state, honest, SEED)
    assert result.verdict is Verdict.PASSED and result.distance < 1e-6, result
    with another_thread_reseeding_the_global_generator():  # and no lock is needed against it
        assert audit_receipt(workload, state, honest, SEED) == result

    fabricated = honest.model_copy(update=dict(grad_sketch=tuple(-v for v in honest.grad_sketch)))
    result = audit_receipt(workload, state, fabricated, SEED)
    assert result.verdict is Verdict.FAILED and result.distance > FAIL_BEYOND

    # Claiming more samples than were computed: the replay takes the extra mini-batches and differs.
    inflated = honest.model_copy(
        update=dict(worker_samples=(2 * PER_WORKER, PER_WORKER), samples=3 * PER_WORKER)
    )
    result = audit_receipt(workload, state, inflated, SEED)
    assert result.verdict is Verdict.FAILED and result.distance > FAIL_BEYOND, result
