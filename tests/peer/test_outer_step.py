"""The outer step's arithmetic (peer/outer_step.py), its served layout, and the task settings."""

from __future__ import annotations

import pytest
import torch

from aggregator.task_publication import TaskFileError, build_task_spec
from peer.outer_round import OuterStepper
from peer.outer_step import OuterSettings, nesterov_outer_step, outgoing
from peer.round_types import RoundPlan
from protocol.identity import Identity
from supernet.outer_state import OuterState, served_consensus, served_layout, split_served

SHAPES = [(4, 3), (7,), (2, 2, 3, 3)]


def _tensors(gen: torch.Generator, scale: float = 1.0) -> list[torch.Tensor]:
    return [torch.randn(s, generator=gen) * scale for s in SHAPES]


def test_the_outer_step_is_pytorchs_nesterov_sgd_on_the_pseudo_gradient():
    gen = torch.Generator().manual_seed(1)
    anchor, lr, mu = _tensors(gen), 0.7, 0.9
    reference = [torch.nn.Parameter(a.clone()) for a in anchor]
    sgd = torch.optim.SGD(reference, lr=lr, momentum=mu, nesterov=True)
    params, momentum = anchor, [torch.zeros_like(a) for a in anchor]
    for _ in range(3):
        average = _tensors(gen, 0.1)
        for p, g in zip(reference, average):
            p.grad = g.clone()
        sgd.step()
        params, momentum = nesterov_outer_step(params, momentum, average, lr, mu)
    for ours, theirs in zip(params, reference):
        torch.testing.assert_close(ours, theirs.detach(), rtol=0, atol=1e-6)


def test_with_lr_1_and_no_momentum_an_outer_step_averages_the_cohorts_parameters():
    """DiLoCo's sanity check: outer SGD with lr 1 and no momentum is plain parameter averaging."""
    gen = torch.Generator().manual_seed(2)
    anchor = _tensors(gen)
    cohorts = [[a - 0.05 * torch.randn(a.shape, generator=gen) for a in anchor] for _ in range(3)]
    sent = [outgoing(OuterState.starting_at(anchor), c, "none")[0] for c in cohorts]
    average = [sum(parts) / len(parts) for parts in zip(*sent)]
    params, _ = nesterov_outer_step(anchor, [torch.zeros_like(a) for a in anchor], average, 1.0, 0.0)
    for p, *versions in zip(params, *cohorts):
        torch.testing.assert_close(p, sum(versions) / len(versions), rtol=0, atol=1e-6)


@pytest.mark.parametrize("codec", ["fp16", "int8", "int4"])
def test_error_feedback_carries_what_compression_left_out_to_the_next_exchange(codec):
    gen = torch.Generator().manual_seed(3)
    anchor = _tensors(gen)
    state = OuterState.starting_at(anchor)
    total_wanted = [torch.zeros_like(a) for a in anchor]
    total_sent = [torch.zeros_like(a) for a in anchor]
    for _ in range(20):
        params = [a - 0.01 * torch.randn(a.shape, generator=gen) for a in state.anchor]
        sent, residue = outgoing(state, params, codec)
        for w, a, p in zip(total_wanted, state.anchor, params):
            w += a - p
        for t, s in zip(total_sent, sent):
            t += s
        # what was sent plus what is kept is exactly what was wanted (nothing dropped)
        for s, r, a, p, old in zip(sent, residue, state.anchor, params, state.residue):
            torch.testing.assert_close(s + r, (a - p) + old, rtol=0, atol=1e-6)
        state = OuterState(state.global_params, state.momentum, state.anchor, residue)
    # over many exchanges the error stays one exchange's rounding, it does not grow
    for w, t, r in zip(total_wanted, total_sent, state.residue):
        torch.testing.assert_close(t + r, w, rtol=0, atol=1e-5)
        assert (w - t).abs().max() <= 0.05 * w.abs().max() + 1e-3


def test_the_served_state_puts_the_global_parameters_and_momentum_under_the_digest_and_splits_back():
    gen = torch.Generator().manual_seed(4)
    params, optimizer_state, buffers = _tensors(gen), _tensors(gen), [torch.randn(5, generator=gen)]
    worker_state = [*params, *optimizer_state, *buffers]
    consensus = len(params) + len(optimizer_state)
    outer = OuterState(_tensors(gen), _tensors(gen), _tensors(gen), _tensors(gen))
    served = served_layout(worker_state, consensus, outer)
    assert served_consensus(consensus, outer) == consensus + 2 * len(params)
    covered = served[: served_consensus(consensus, outer)]
    assert all(any(t is c for c in covered) for t in [*outer.global_params, *outer.momentum])
    assert not any(any(t is c for c in covered) for t in [*outer.anchor, *outer.residue, *buffers])
    back, got = split_served(served, consensus, len(worker_state), len(params))
    assert all(a is b for a, b in zip(back, worker_state)) and len(back) == len(worker_state)
    for part in ("global_params", "momentum", "anchor", "residue"):
        assert all(a is b for a, b in zip(getattr(got, part), getattr(outer, part), strict=True)), part
    same, none = split_served(worker_state, consensus, len(worker_state), len(params))
    assert none is None and len(same) == len(worker_state)
    with pytest.raises(ValueError, match="expected"):
        split_served(served[:-1], consensus, len(worker_state), len(params))


def test_an_inner_steps_plan_is_its_cohort_alone():
    plan = RoundPlan(5, 9, "b", 1, 2, 2, ("p1", "p2", "p3", "p4"), (("p1", "p2"), ("p3", "p4")))
    inner = plan.cohort_only()
    assert (inner.roster, inner.cohorts, inner.cohort_rank, inner.num_cohorts) == (
        ("p3", "p4"),
        (("p3", "p4"),),
        0,
        1,
    )
    assert (inner.round_index, inner.attempt, inner.cohort, inner.cohort_size) == (5, 9, "b", 2)


def test_outer_boundaries_follow_every_inner_steps_rounds():
    settings = OuterSettings(inner_steps=3, lr=0.7, momentum=0.9, compression="int8")
    assert [r for r in range(10) if settings.is_boundary(r)] == [2, 5, 8]


def test_the_task_file_sets_the_outer_mode_and_refuses_bad_values(tmp_path):
    identity = Identity.generate()
    good = tmp_path / "outer.toml"
    good.write_text(
        '[task]\nname = "digits"\n[swarm]\nsync = "outer"\ninner_steps = 25\nouter_lr = "0.5"\n'
        'outer_momentum = "0.8"\nouter_compression = "int4"\n'
    )
    settings = OuterSettings.of_task(build_task_spec(str(good), identity).params)
    assert settings == OuterSettings(inner_steps=25, lr=0.5, momentum=0.8, compression="int4", overlap=True)
    assert OuterSettings.of_task(build_task_spec("digits", identity).params) is None
    for line, says in [
        ('sync = "sometimes"', "sync"),
        ("inner_steps = 0", "inner_steps"),
        ('outer_momentum = "1.5"', "outer_momentum"),
        ('outer_compression = "int2"', "outer_compression"),
        ('outer_lr = "0"', "outer_lr"),
    ]:
        bad = tmp_path / "bad.toml"
        bad.write_text(
            f'[task]\nname = "digits"\n[swarm]\nsync = "outer"\n{line}\n'.replace(
                'sync = "outer"\nsync', "sync"
            )
        )
        with pytest.raises(TaskFileError, match=says) as err:
            build_task_spec(str(bad), identity)
        assert "\n" not in str(err.value)


def test_model_parallel_cohorts_average_each_weight_over_the_cohorts_that_trained_it():
    """Two cohorts, each touching its own half of a weight and both a shared part: the outer step's
    pseudo-gradient is each cohort's own where only it trained, their mean where both did, and nothing
    (not a diluted half, not drift) where neither did."""
    anchor = [torch.zeros(8)]
    trained = {"a": torch.tensor([1, 1, 1, 0, 0, 0, 1, 0], dtype=torch.bool),
               "b": torch.tensor([0, 0, 0, 1, 1, 1, 1, 0], dtype=torch.bool)}  # fmt: skip
    settings = OuterSettings(inner_steps=1, lr=1.0, momentum=0.0, compression="none", overlap=False)
    payloads = {}
    for name, sign in (("a", 1.0), ("b", 2.0)):
        stepper = OuterStepper(
            settings,
            OuterState.starting_at(anchor),
            None,
            [torch.zeros(8)],
            1,
            [],
            lambda _: None,
            mask_aware=True,
        )
        # the cohort moved every weight (weight decay drifts untouched ones too), trained only its own
        stepper._worker_state[0].copy_(-sign * torch.ones(8))
        stepper.note_inner_step([trained[name].float()])
        payloads[name], residue = stepper._outgoing()
        assert torch.equal(payloads[name][1], trained[name].float())  # the mask travels with it
        assert torch.equal(residue[0], torch.zeros(8))  # nothing left out (no compression)
    # what the exchange delivers: the members-weighted mean of the two payloads (one member each)
    average = [(a + b) / 2 for a, b in zip(payloads["a"], payloads["b"])]
    stepper._apply(average, [torch.zeros(8)])
    expected = torch.tensor([1.0, 1.0, 1.0, 2.0, 2.0, 2.0, 1.5, 0.0])  # pseudo-gradients: a 1, b 2
    torch.testing.assert_close(stepper.state.global_params[0], -expected, rtol=0, atol=1e-6)
