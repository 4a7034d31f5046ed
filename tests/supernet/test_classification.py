"""ClassificationSupernet: structure, activation, export equivalence and standalone loading, FLOPs,
parameter masks, channel sorting and BN recalibration."""

from __future__ import annotations

import copy
import os
import random
import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from supernet import (
    ClassificationSupernet,
    SearchSpace,
    SubnetConfig,
    recalibrate_bn,
    save_exported_program,
    save_torchscript,
    torch_counted_macs,
    training_flops_per_sample,
)
from tests.supernet.threads import single_torch_thread  # noqa: F401


def tiny_net(seed: int = 0, **kw) -> ClassificationSupernet:
    torch.manual_seed(seed)
    options = dict(width_mult=0.25, head_channels=32, channel_divisor=4)
    options.update(kw)
    return ClassificationSupernet(10, 1, **options)


def scramble(net: nn.Module, seed: int = 1) -> nn.Module:
    """Give every BN non-trivial parameters and statistics and perturb the kernel transformations,
    so that equivalence and gradient tests do not pass by accident (identity init, zero-init BN)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.weight.copy_(0.5 + torch.rand(m.weight.shape, generator=g))
                m.bias.copy_(0.1 * torch.randn(m.bias.shape, generator=g))
                m.running_mean.copy_(0.1 * torch.randn(m.running_mean.shape, generator=g))
                m.running_var.copy_(0.5 + torch.rand(m.running_var.shape, generator=g))
        for name, p in net.named_parameters():
            if "kernel_transforms" in name:
                p.add_(0.05 * torch.randn(p.shape, generator=g))
    return net


@pytest.fixture(scope="module")
def net() -> ClassificationSupernet:
    return scramble(tiny_net())


def test_structure_five_units_each_halving(net):
    assert isinstance(net.units, nn.ModuleList) and len(net.units) == 5
    shapes = []
    hooks = [
        u.register_forward_hook(lambda m, i, o: shapes.append((i[0].shape[-1], o.shape[-1])))
        for u in net.units
    ]
    net.eval()
    for cfg in (net.largest_config(), net.smallest_config()):
        shapes.clear()
        net.set_active(cfg)
        net(torch.randn(2, 1, 32, 32))
        assert shapes == [(32, 16), (16, 8), (8, 4), (4, 2), (2, 1)]
    for h in hooks:
        h.remove()
    for unit in net.units:
        assert unit.blocks[0].stride == 2 and unit.blocks[0].depthwise_conv.stride == 2
        assert all(b.stride == 1 and b.residual for b in unit.blocks[1:])
    assert net.space == SearchSpace()


def test_outputs_probabilities_in_eval_and_logits_in_training(net):
    x = torch.randn(3, 1, 32, 32)
    net.set_active(net.largest_config())
    net.eval()
    probs = net(x)
    assert probs.shape == (3, 10) and torch.allclose(probs.sum(1), torch.ones(3)) and (probs >= 0).all()
    assert torch.allclose(probs, torch.softmax(net.logits(x), 1))
    net.train()
    logits = net(x)
    assert not torch.allclose(logits.sum(1), torch.ones(3))
    net.eval()


def test_configs_and_invalid_activation(net):
    assert net.largest_config() == SubnetConfig.uniform(5, 4, 7, 6)
    assert net.smallest_config() == SubnetConfig.uniform(5, 2, 3, 3)
    assert net.sample_config(random.Random(1)) == net.sample_config(random.Random(1))
    bad = SubnetConfig.uniform(5, 2, 3, 3).to_dict()
    bad["kernel_sizes"][2][1] = 4
    with pytest.raises(ValueError, match=r"^kernel_sizes\[2\]\[1\]"):
        net.set_active(SubnetConfig.from_dict(bad))
    with pytest.raises(ValueError, match=r"^depths\[0\]"):
        net.set_active(SubnetConfig.uniform(5, 9, 3, 3))
    with pytest.raises(ValueError, match=r"^depths"):
        net.export(SubnetConfig.uniform(4, 2, 3, 3))
    with pytest.raises(ValueError, match="^unit_channels"):
        ClassificationSupernet(10, 1, unit_channels=(8, 8, 8))


def test_export_matches_supernet_on_50_random_configs(net):
    rng = random.Random(2024)
    x = torch.randn(4, 1, 32, 32)
    configs = [net.largest_config(), net.smallest_config()] + [net.sample_config(rng) for _ in range(48)]
    net.eval()
    worst = 0.0
    for cfg in configs:
        net.set_active(cfg)
        model = net.export(cfg)
        assert not model.training
        with torch.no_grad():
            worst = max(worst, (model(x) - net(x)).abs().max().item())
            worst = max(worst, (model.logits(x) - net.logits(x)).abs().max().item())
    assert worst <= 1e-5, worst
    # the export is plain torch: no elastic module inside
    assert not any("Elastic" in type(m).__name__ for m in model.modules())


def test_export_after_recalibration_matches_recalibrated_supernet():
    net = scramble(tiny_net(3))
    loader = [torch.randn(16, 1, 32, 32) for _ in range(3)]
    cfg = net.sample_config(5)
    recalibrate_bn(net, cfg, loader, 3)
    net.eval()
    x = torch.randn(5, 1, 32, 32)
    with torch.no_grad():
        assert (net.export(cfg)(x) - net(x)).abs().max().item() <= 1e-5


BLOCK_MANTA = """
import sys
for name in ("supernet", "tasks", "protocol", "peer", "aggregator"):
    sys.modules[name] = None  # any import of MANTA code now fails
try:
    import supernet
except ImportError:
    pass
else:
    raise SystemExit("supernet was importable")
"""


def test_exported_model_loads_in_a_process_without_manta(tmp_path):
    net = scramble(tiny_net(4))
    cfg = net.sample_config(random.Random(9))
    model = net.export(cfg)
    x = torch.randn(3, 1, 32, 32)
    with torch.no_grad():
        expected = net.eval().set_active(cfg)(x)
    torch.save(x, tmp_path / "x.pt")
    save_torchscript(model, tmp_path / "subnet.pt")
    save_exported_program(model, tmp_path / "subnet.pt2", x)
    code = BLOCK_MANTA + textwrap.dedent(
        """
        import torch
        torch.set_num_threads(1)
        x = torch.load("x.pt")
        scripted = torch.jit.load("subnet.pt")
        program = torch.export.load("subnet.pt2").module()
        with torch.no_grad():
            torch.save({"jit": scripted(x), "export": program(x), "export5": program(torch.cat([x, x[:2]]))}, "out.pt")
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run(
        [sys.executable, "-I", "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240
    )
    assert result.returncode == 0, result.stderr[-2000:]
    out = torch.load(tmp_path / "out.pt")
    assert (out["jit"] - expected).abs().max().item() <= 1e-5
    assert (out["export"] - expected).abs().max().item() <= 1e-5
    assert out["export5"].shape == (5, 10)


def test_flops_match_torch_flop_counter_on_exported_models():
    net = tiny_net(5)
    rng = random.Random(6)
    x = torch.randn(2, 1, 32, 32)
    for cfg in [net.largest_config(), net.smallest_config()] + [net.sample_config(rng) for _ in range(6)]:
        macs = net.flops(cfg, (1, 32, 32))
        assert macs == net.flops(cfg, (32, 32))
        assert torch_counted_macs(net.export(cfg), x) == macs
        assert training_flops_per_sample(net, cfg, (1, 32, 32)) == 3 * macs
    # at another resolution too (stride-1 stem: 64×64 ends at 2×2)
    cfg = net.sample_config(rng)
    assert torch_counted_macs(net.export(cfg), torch.randn(2, 1, 64, 48)) == net.flops(cfg, (64, 48))
    assert net.flops(net.largest_config()) > net.flops(net.smallest_config()) * 4


def test_training_flops_are_about_three_forwards():
    """Training credit is 3x the forward MACs: each dense layer's backward is two products of its
    forward's size (input gradient and weight gradient), one for the first layer (no input gradient).

    torch's counter is checked per module on the layers it counts correctly; it over-counts the
    backward of grouped (depthwise) convolutions as if they were dense, so those are left out.
    """
    net = tiny_net(6)
    cfg = net.sample_config(3)
    model = net.export(cfg).train()
    x = torch.randn(2, 1, 32, 32)
    with FlopCounterMode(display=False) as counter:
        model(x).sum().backward()
    counts = counter.get_flop_counts()
    checked = 0
    for name, module in model.named_modules():
        if isinstance(module, nn.Conv2d) and module.groups == 1:
            ops = {str(k): v for k, v in counts[f"StaticClassifier.{name}"].items()}
            forward, backward = ops["aten.convolution"], ops["aten.convolution_backward"]
            assert backward == (1 if name == "stem.0" else 2) * forward, name
            checked += 1
    assert checked > 10
    assert training_flops_per_sample(net, cfg, (1, 32, 32)) == 3 * net.flops(cfg, (1, 32, 32))


def _grads(net: ClassificationSupernet, cfg: SubnetConfig, x: torch.Tensor) -> dict[str, torch.Tensor]:
    net.zero_grad(set_to_none=True)
    net.train().set_active(cfg)
    (net.logits(x) * torch.linspace(-1, 1, 10)).sum().backward()
    return {n: (torch.zeros_like(p) if p.grad is None else p.grad) for n, p in net.named_parameters()}


def test_parameter_masks_match_gradients():
    net = scramble(tiny_net(7))
    x = torch.randn(8, 1, 32, 32)
    rng = random.Random(8)
    names = [n for n, _ in net.named_parameters()]
    for cfg in [net.largest_config(), net.smallest_config()] + [net.sample_config(rng) for _ in range(5)]:
        grads = _grads(net, cfg, x)
        for input_size in (None, (1, 32, 32)):
            masks = net.parameter_masks(cfg, input_size)
            assert list(masks) == names
            for name, p in net.named_parameters():
                mask, grad = masks[name], grads[name]
                assert mask.dtype == torch.bool and mask.shape == p.shape
                assert not grad[~mask].any(), f"{name}: gradient outside the mask"
                if mask.any():
                    assert grad[mask].ne(0).any(), f"{name}: no gradient inside the mask"
                if input_size is not None and mask.any() and p.ndim >= 2:
                    # exact for this input size: (almost) every masked weight gets a gradient (BN
                    # biases before a training-mode BN can get exactly zero: BN removes shifts)
                    assert grad[mask].ne(0).float().mean() > 0.9, name
                if input_size is not None and "kernel_transforms" in name and mask.any():
                    rows = mask.any(1)
                    assert torch.equal(grad.ne(0).any(1), rows), name  # exactly the used rows
    largest = net.parameter_masks(net.largest_config())
    assert all(m.all() != ("kernel_transforms" in n) for n, m in largest.items())  # 7×7 needs no transform


def test_parameter_masks_of_kernel_transformations():
    net = tiny_net(9)
    cfg = SubnetConfig.uniform(5, 2, 3, 4)
    masks = net.parameter_masks(cfg)
    conv = "units.0.blocks.0.depthwise_conv"
    w = masks[f"{conv}.weight"]
    mid = net.units[0].blocks[0].mid_channels(4)
    assert w[:mid, 0, 1:6, 1:6].all() and not w[:mid, 0, 0].any() and not w[mid:].any()  # centre 5×5
    rows_7to5 = masks[f"{conv}.kernel_transforms.7to5"].any(1).reshape(5, 5)
    assert rows_7to5[1:4, 1:4].all() and rows_7to5.sum() == 9  # only rows producing the centre 3×3
    assert masks[f"{conv}.kernel_transforms.5to3"].all()
    assert not masks["units.0.blocks.2.expand_conv.weight"].any()  # beyond depth 2


def test_channel_sorting_preserves_the_largest_and_orders_importance():
    net = scramble(tiny_net(10))
    x = torch.randn(4, 1, 32, 32)
    twin = copy.deepcopy(net)
    net.eval().set_active(net.largest_config())
    with torch.no_grad():
        before = net(x)
        small_before = net.set_active(net.smallest_config())(x)
    record = net.sort_channels()
    assert record
    with torch.no_grad():
        assert (net.set_active(net.largest_config())(x) - before).abs().max() < 1e-5
        assert (net.set_active(net.smallest_config())(x) - small_before).abs().max() > 1e-4
    for unit in net.units:
        for block in unit.blocks:
            imp = block.channel_importance()
            assert torch.all(imp[:-1] >= imp[1:])
    # deterministic: the same parameters give the same result
    twin.sort_channels()
    assert all(
        torch.equal(a, b) for a, b in zip(net.state_dict().values(), twin.state_dict().values(), strict=True)
    )
    # sorting again changes nothing
    assert net.sort_channels() == []


def test_channel_sorting_keeps_protected_bands():
    net = scramble(tiny_net(11))
    block = net.units[1].blocks[0]
    edge = block.mid_channels(4)
    before = block.project_conv.weight.detach().clone()
    block.sort_channels(protected_expand_ratios=(4,))
    after = block.project_conv.weight.detach()
    key = lambda w: sorted(w.abs().sum(dim=(0, 2, 3)).tolist())  # noqa: E731
    assert key(after[:, :edge]) == key(before[:, :edge])  # the same channels stay inside width 4
    imp = block.channel_importance()
    assert torch.all(imp[: edge - 1] >= imp[1:edge]) and torch.all(imp[edge:-1] >= imp[edge + 1 :])


def test_channel_sorting_permutes_optimizer_state():
    """After sorting with the optimizer, training continues exactly as the unsorted twin does."""
    net = scramble(tiny_net(12))
    x, y = torch.randn(8, 1, 32, 32), torch.randint(0, 10, (8,))

    def step(model, opt):
        opt.zero_grad()
        model.train().set_active(model.largest_config())
        nn.functional.cross_entropy(model.logits(x), y).backward()
        opt.step()

    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    step(net, opt)
    twin = copy.deepcopy(net)
    twin_opt = torch.optim.SGD(twin.parameters(), lr=0.05, momentum=0.9)
    twin_opt.load_state_dict(copy.deepcopy(opt.state_dict()))  # (load_state_dict shares the tensors)
    net.sort_channels(optimizer=opt)
    step(net, opt)
    step(twin, twin_opt)
    net.eval().set_active(net.largest_config())
    twin.eval().set_active(twin.largest_config())
    with torch.no_grad():
        assert (net(x) - twin(x)).abs().max() < 1e-5


def test_recalibrate_bn_sets_statistics_for_the_config_and_restores_state():
    net = scramble(tiny_net(13))
    net.eval()
    batches = [torch.randn(16, 1, 32, 32) + i for i in range(3)]
    cfg = net.smallest_config()
    recalibrate_bn(net, cfg, iter(batches), num_batches=2)
    assert not net.training and net.active == cfg
    stem_conv, stem_bn = net.stem[0], net.stem[1]
    with torch.no_grad():
        means = [stem_conv(b).mean(dim=(0, 2, 3)) for b in batches[:2]]
    assert torch.allclose(stem_bn.running_mean, sum(means) / 2, atol=1e-5)
    assert all(m.momentum == 0.1 for m in net.modules() if isinstance(m, nn.BatchNorm2d))
    # a used middle channel of the first block got statistics from this config
    bn = net.units[0].blocks[0].expand_bn
    mid = net.units[0].blocks[0].mid_channels(3)
    assert not torch.allclose(bn.running_var[:mid], torch.ones(mid))
    with pytest.raises(ValueError, match="^num_batches"):
        recalibrate_bn(net, cfg, batches, 0)
    with pytest.raises(ValueError, match="^loader"):
        recalibrate_bn(net, cfg, [], 2)
