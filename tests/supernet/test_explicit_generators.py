"""Computations that must give the same numbers every time do so without a process-wide lock.

Initialisation, augmentation, dropout and BN recalibration draw from explicit ``torch.Generator``
objects seeded from the configuration or the round, never from torch's global generator, which all
threads of a process share. So while another thread keeps re-seeding and drawing from the global
generator (as any library code may), building a supernet gives the same weights, a spot audit
replaying a peer's contribution gets bit-identical gradients, and BN recalibration the same
statistics; and none of them moves the global generator under that other thread's feet.
"""

from __future__ import annotations

import threading
import time

import torch

from supernet.contribution import compute_contribution
from supernet.training.evaluation import recalibrate_for_evaluation
from supernet.training.gradients import accumulate_gradients
from supernet.training.schedule import step_configs
from supernet.workload import workload_for
from tests.supernet.threads import (
    another_thread_reseeding_the_global_generator,
    single_torch_thread,  # noqa: F401
)

TINY = dict(width_mult=0.25, head_channels=32, channel_divisor=4, batch_size=16, num_subnets=2)


def _same_tensors(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_builds_give_the_same_weights_while_another_thread_seeds_and_draws():
    for task in ("digits", "stereo-synthetic"):
        workload = workload_for(task, TINY if task == "digits" else {})
        reference = workload.build().state_dict()
        with another_thread_reseeding_the_global_generator():
            built = [workload.build().state_dict() for _ in range(3)]
        assert all(_same_tensors(reference, state) for state in built), task
    other = workload_for("digits", dict(TINY, seed=1)).build().state_dict()
    assert not _same_tensors(workload_for("digits", TINY).build().state_dict(), other)


def test_a_build_leaves_the_global_generator_alone():
    """The old failure, the other way round: a thread replaying draws of the global generator gets
    its own sequence, whatever another thread builds meanwhile."""
    workload = workload_for("digits", TINY)
    stop = threading.Event()
    builds = [0]

    def build_repeatedly() -> None:
        while not stop.is_set():
            workload.build()
            builds[0] += 1

    builder = threading.Thread(target=build_repeatedly, daemon=True)
    builder.start()
    deadline = time.monotonic() + 120  # bounded: a builder that died must fail the test, not hang it
    try:
        torch.manual_seed(1234)
        draws = []
        while builds[0] < 3 and builder.is_alive() and time.monotonic() < deadline:  # the builds run in here
            draws.append(torch.rand(1))
            time.sleep(0.001)
    finally:
        stop.set()
        builder.join(timeout=120)
    assert builds[0] >= 3, "the builds never ran while the other thread drew"
    torch.manual_seed(1234)
    assert torch.equal(torch.cat(draws), torch.rand(len(draws)))


def test_a_contribution_replays_bit_identical_gradients_while_another_thread_draws():
    # dropout on, so the replay covers the augmentation and the dropout masks
    workload = workload_for("digits", dict(TINY, dropout=0.3))
    net = workload.build()
    configs = step_configs(net, 3, workload.cfg)

    def contribution():
        work = compute_contribution(workload, net, configs, "cpu", 7, 3, "peer/0", go_on=lambda n: n < 48)
        return work.numerator, work.loss_sum

    state = torch.get_rng_state()
    reference, loss = contribution()
    assert torch.equal(torch.get_rng_state(), state)  # the global generator was not used
    with another_thread_reseeding_the_global_generator():
        for _ in range(2):
            numerator, again = contribution()
            assert again == loss
            assert all(torch.equal(a, b) for a, b in zip(reference, numerator, strict=True))


def test_dropout_masks_come_from_the_given_generator():
    workload = workload_for("digits", dict(TINY, dropout=0.5))
    net = workload.build()
    inputs, targets = workload.batch(range(16), torch.Generator().manual_seed(0))
    configs = [net.largest_config()]

    def gradients(seed: int) -> list[torch.Tensor]:
        generator = torch.Generator().manual_seed(seed)
        accumulate_gradients(net, inputs, targets, configs, workload.cfg, generator=generator)
        return [p.grad.clone() for p in net.parameters()]

    first = gradients(1)
    assert all(torch.equal(a, b) for a, b in zip(first, gradients(1), strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(first, gradients(2), strict=True))


def test_bn_recalibration_gives_the_same_statistics_while_another_thread_draws():
    workload = workload_for("digits", dict(TINY, bn_calibration_batches=3))
    net = workload.build()
    sub = net.sample_config(5)

    def statistics() -> dict[str, torch.Tensor]:
        recalibrate_for_evaluation(net, sub, workload.task, workload.cfg)
        return {k: v.clone() for k, v in net.state_dict().items() if "running" in k}

    state = torch.get_rng_state()
    reference = statistics()
    assert torch.equal(torch.get_rng_state(), state)
    with another_thread_reseeding_the_global_generator():
        assert _same_tensors(reference, statistics())
        rows = workload.evaluate(net, {"sub": sub})
    assert rows == workload.evaluate(net, {"sub": sub})
