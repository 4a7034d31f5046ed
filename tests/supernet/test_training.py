"""The training recipe: config, phases, learning rate, gradient accumulation, and the loop."""

from __future__ import annotations

import json
import random

import pytest
import torch
import torch.nn.functional as F

from supernet.training.build import build_supernet
from supernet.training.config import TrainConfig
from supernet.training.gradients import accumulate_gradients
from supernet.training.loop import train
from supernet.training.optimizer import lr_at, make_optimizer, optimizer_step
from supernet.training.schedule import maybe_sort_channels, phase_at, phases, space_for_phase, step_configs
from tests.supernet.threads import single_torch_thread  # noqa: F401

TINY = dict(width_mult=0.25, head_channels=32, channel_divisor=4)


def tiny_cfg(**kw) -> TrainConfig:
    options = dict(TINY, total_steps=100, batch_size=8, num_subnets=3)
    options.update(kw)
    return TrainConfig(**options)


def test_config_validation_and_json_round_trip():
    cfg = tiny_cfg(schedule="progressive", optimizer="adamw")
    assert TrainConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    for field, value in [
        ("schedule", "cyclic"),
        ("optimizer", "lion"),
        ("num_subnets", 0),
        ("batch_size", 1),
        ("warmup_steps", 100),
        ("phase_fractions", (1, 1)),
        ("kernel_sizes", (3, 4)),
    ]:
        with pytest.raises(ValueError, match=f"^{field}"):
            tiny_cfg(**{field: value})
    with pytest.raises(ValueError, match="^colour"):
        TrainConfig.from_dict({"colour": "red"})


def test_progressive_phases_cover_all_steps_in_order():
    cfg = tiny_cfg(schedule="progressive", total_steps=100, phase_fractions=(0.1, 0.2, 0.3, 0.4))
    schedule = phases(cfg)
    assert [(p.name, p.stage) for p in schedule] == [
        ("full", 0), ("kernel", 0), ("depth", 0), ("depth", 1), ("width", 0), ("width", 1)
    ]  # fmt: skip
    assert schedule[0].start == 0 and schedule[-1].end == 100
    assert all(a.end == b.start for a, b in zip(schedule, schedule[1:], strict=False))
    assert [p.end - p.start for p in schedule] == [10, 20, 15, 15, 20, 20]
    full, kernel, depth0, depth1, width0, width1 = schedule
    assert (full.kernel_sizes, full.expand_ratios, full.depths, full.num_subnets) == ((7,), (6,), (4,), 1)
    assert kernel.kernel_sizes == (3, 5, 7) and kernel.depths == (4,) and kernel.num_subnets == 3
    assert depth0.depths == (3, 4) and depth1.depths == (2, 3, 4) and depth1.expand_ratios == (6,)
    assert width0.expand_ratios == (4, 6) and width0.sort_channels and width0.protected_expand_ratios == ()
    assert width1.expand_ratios == (3, 4, 6) and width1.protected_expand_ratios == (4,)
    assert phase_at(0, cfg) == full and phase_at(9, cfg) == full and phase_at(10, cfg) == kernel
    assert phase_at(99, cfg) == width1 and phase_at(500, cfg) == width1  # rounds past the end stay last
    net = build_supernet(cfg, 10, 1)
    assert space_for_phase(kernel, net.space).expand_ratios == (6,)
    # sandwich schedule: one phase, the whole space
    assert [p.name for p in phases(tiny_cfg())] == ["sandwich"]


def test_step_configs_follow_the_phase_and_are_deterministic():
    cfg = tiny_cfg(schedule="progressive", total_steps=100, phase_fractions=(0.1, 0.2, 0.3, 0.4))
    net = build_supernet(cfg, 10, 1)
    assert step_configs(net, 3, cfg) == [net.largest_config()]
    for step in (15, 40, 90):
        configs = step_configs(net, step, cfg)
        assert configs == step_configs(net, step, cfg) and len(configs) == 3
        assert configs[0] == net.largest_config()
        space = space_for_phase(phase_at(step, cfg), net.space)
        assert all(space.contains(c) for c in configs)
    assert step_configs(net, 15, cfg)[1] == net.space.restrict(expand_ratios=(6,), depths=(4,)).smallest()
    assert step_configs(net, 40, cfg, salt="a") != step_configs(net, 40, cfg, salt="b")


def test_learning_rate_schedule():
    cfg = tiny_cfg(total_steps=100, lr=0.2, min_lr=0.02, warmup_steps=10)
    assert lr_at(0, cfg) == pytest.approx(0.02) and lr_at(9, cfg) == pytest.approx(0.2)
    assert lr_at(10, cfg) == pytest.approx(0.2) and lr_at(100, cfg) == pytest.approx(0.02)
    assert lr_at(55, cfg) == pytest.approx(0.11)
    values = [lr_at(s, cfg) for s in range(10, 101)]
    assert all(a >= b for a, b in zip(values, values[1:], strict=False))


def test_optimizer_groups_and_step():
    cfg = tiny_cfg(weight_decay=0.1)
    net = build_supernet(cfg, 10, 1)
    opt = make_optimizer(net, cfg)
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    names = {id(p): n for n, p in net.named_parameters()}
    assert all(p.ndim > 1 and "kernel_transforms" not in names[id(p)] for p in decay["params"])
    assert any("kernel_transforms" in names[id(p)] for p in no_decay["params"])
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(net.parameters()))
    assert isinstance(make_optimizer(net, tiny_cfg(optimizer="adamw")), torch.optim.AdamW)
    for p in net.parameters():
        p.grad = torch.ones_like(p)
    assert optimizer_step(net, opt, 50, cfg) == pytest.approx(lr_at(50, cfg))
    assert opt.param_groups[0]["lr"] == pytest.approx(lr_at(50, cfg))


def _batch(n=8):
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, 1, 32, 32, generator=g), torch.randint(0, 10, (n,), generator=g)


def test_accumulate_gradients_sums_subnet_gradients_without_stepping():
    cfg = tiny_cfg(distill=False)
    net = build_supernet(cfg, 10, 1)
    x, y = _batch()
    configs = [net.largest_config(), net.smallest_config(), net.sample_config(random.Random(1))]
    before = {n: p.detach().clone() for n, p in net.named_parameters()}
    stats = accumulate_gradients(net, x, y, configs, cfg)
    assert all(torch.equal(p, before[n]) for n, p in net.named_parameters())  # no optimizer step
    assert all(p.grad is not None and p.grad.is_contiguous() for p in net.parameters())
    grads = {n: p.grad.clone() for n, p in net.named_parameters()}
    expected = {n: torch.zeros_like(p) for n, p in net.named_parameters()}
    losses = []
    for cfg_ in configs:
        net.zero_grad(set_to_none=True)
        net.train().set_active(cfg_)
        loss = F.cross_entropy(net.logits(x), y)
        loss.backward()
        losses.append(loss.item())
        for n, p in net.named_parameters():
            if p.grad is not None:
                expected[n] += p.grad
    for n in grads:
        assert torch.allclose(grads[n], expected[n], atol=1e-5, rtol=1e-4), n
    assert stats["losses"] == pytest.approx(losses, rel=1e-5)
    assert stats["loss"] == pytest.approx(sum(losses) / 3, rel=1e-5)
    assert stats["samples"] == 8 and stats["config_hashes"] == [c.hash for c in configs]
    assert stats["train_macs"] == sum(3 * net.flops(c, (1, 32, 32)) * 8 for c in configs)
    # gradients are zeroed first: a second call gives the same gradients, not double
    accumulate_gradients(net, x, y, configs, cfg)
    for n, p in net.named_parameters():
        assert torch.allclose(p.grad, grads[n], atol=1e-6), n


def test_in_place_distillation_uses_the_largest_as_teacher():
    cfg = tiny_cfg(distill=True, distill_weight=0.5, distill_temperature=2.0)
    net = build_supernet(cfg, 10, 1)
    x, y = _batch()
    small = net.smallest_config()
    stats = accumulate_gradients(net, x, y, [net.largest_config(), small], cfg)
    assert stats["distill_losses"][0] == 0.0 and stats["distill_losses"][1] > 0
    assert stats["losses"][1] == pytest.approx(
        stats["task_losses"][1] + 0.5 * stats["distill_losses"][1], rel=1e-5
    )
    # without the largest in the list the teacher runs once without gradients (and is paid for)
    alone = accumulate_gradients(net, x, y, [small], cfg)
    assert alone["distill_losses"][0] == pytest.approx(stats["distill_losses"][1], rel=1e-4)
    assert alone["train_macs"] == 8 * (
        net.flops(net.largest_config(), (1, 32, 32)) + 3 * net.flops(small, (1, 32, 32))
    )


def test_channel_sorting_happens_at_width_stage_starts_only():
    cfg = tiny_cfg(schedule="progressive", total_steps=100, phase_fractions=(0.1, 0.2, 0.3, 0.4))
    net = build_supernet(cfg, 10, 1)
    opt = make_optimizer(net, cfg)
    starts = [p.start for p in phases(cfg) if p.sort_channels]
    assert starts == [60, 80]
    assert [s for s in range(100) if maybe_sort_channels(net, s, cfg, opt)] == starts


def test_train_runs_end_to_end_deterministically():
    cfg = tiny_cfg(total_steps=4, batch_size=16, eval_random_subnets=1, bn_calibration_batches=2, log_every=2)
    lines: list[str] = []
    state = random.getstate(), torch.get_rng_state()
    first = train(cfg, progress=lines.append)
    assert random.getstate() == state[0] and torch.equal(torch.get_rng_state(), state[1])
    assert [row["name"] for row in first["final"]] == ["largest", "smallest", "random-1"]
    for row in first["final"]:
        assert 0.0 <= row["accuracy"] <= 1.0 and row["macs"] > 0 and len(row["hash"]) == 64
    assert len(first["history"]) == 4 and first["train_macs"] > 0
    assert any(line.startswith("step 2/4") for line in lines) and lines[-1].startswith("final")
    second = train(cfg, progress=lambda _: None)
    a, b = first["net"].state_dict(), second["net"].state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert [r["accuracy"] for r in first["final"]] == [r["accuracy"] for r in second["final"]]


def test_progressive_training_runs_through_every_phase():
    cfg = tiny_cfg(
        schedule="progressive", total_steps=7, batch_size=8, eval_random_subnets=0, bn_calibration_batches=1
    )
    lines: list[str] = []
    result = train(cfg, progress=lines.append)
    assert len({phase_at(s, cfg).name for s in range(7)}) == 4
    assert sum("sorted channels" in line for line in lines) == 2
    assert [row["name"] for row in result["final"]] == ["largest", "smallest"]
