"""StereoSupernet: structure, shapes, correlation, export equivalence, FLOPs, masks and bad input."""

from __future__ import annotations

import random
import subprocess
import sys
import textwrap

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from supernet import SearchSpace, StereoSupernet, SubnetConfig, save_torchscript
from supernet.elastic.blocks import ElasticUnit
from supernet.stereo.correlation import correlation_1d, correlation_1d_loop
from supernet.stereo.static import StaticStereo
from tasks.stereo import predict_disparity

TINY = dict(widths=(8, 8, 8, 8, 8, 16), stem_channels=8, max_displacement=4, redir_channels=8)


def tiny_net(seed: int = 0, **overrides) -> StereoSupernet:
    torch.manual_seed(seed)
    return StereoSupernet(**{**TINY, **overrides})


def _randomise_bn(net: torch.nn.Module, seed: int = 1) -> None:
    """Non-trivial BN scales and statistics, so export equivalence is tested on real arithmetic
    (residual blocks start as the identity otherwise)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.weight.copy_(torch.rand(m.weight.shape, generator=g) + 0.5)
                m.bias.copy_(torch.randn(m.bias.shape, generator=g) * 0.1)
                m.running_mean.copy_(torch.randn(m.running_mean.shape, generator=g) * 0.1)
                m.running_var.copy_(torch.rand(m.running_var.shape, generator=g) + 0.5)


def _pair(batch=2, height=64, width=128, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(batch, 3, height, width, generator=g), torch.rand(batch, 3, height, width, generator=g)


def test_six_searchable_units_and_config_api():
    net = tiny_net()
    assert isinstance(net.units, torch.nn.ModuleList) and len(net.units) == 6
    assert all(isinstance(u, ElasticUnit) for u in net.units)
    assert net.largest_config() == SubnetConfig.uniform(6, 4, 7, 6)
    assert net.smallest_config() == SubnetConfig.uniform(6, 2, 3, 3)
    assert net.sample_config(5) == net.sample_config(random.Random(5))
    with pytest.raises(ValueError, match="num_units"):
        StereoSupernet(SearchSpace(num_units=5))
    with pytest.raises(ValueError, match=r"kernel_sizes\[0\]\[0\]"):
        net.set_active(SubnetConfig.uniform(6, 2, 4, 3))
    with pytest.raises(ValueError, match="depths"):
        net.set_active(SubnetConfig.uniform(5, 2, 3, 3))
    with pytest.raises(ValueError, match="depths"):
        net.set_active(SubnetConfig.uniform(6, 9, 3, 3))


def test_training_mode_returns_seven_predictions_coarse_to_fine_eval_the_finest():
    net = tiny_net()
    left, right = _pair(batch=2, height=64, width=128)
    outs = net(left, right)
    assert isinstance(outs, list) and len(outs) == 7
    assert [tuple(o.shape) for o in outs] == [(2, 1, 64 >> s, 128 >> s) for s in range(6, -1, -1)]
    net.eval()
    finest = net(left, right)
    assert finest.shape == (2, 1, 64, 128)
    assert torch.allclose(finest, net.multiscale(left, right)[-1])


def test_the_largest_subnet_trains_one_step_with_finite_gradients():
    from tasks.stereo import MultiScaleLoss, generate_pair

    net = tiny_net()
    pair = generate_pair(0, 64, 128, 24)
    loss = MultiScaleLoss()(
        net(pair["left"][None], pair["right"][None]), pair["disparity"][None], pair["valid"][None]
    )
    loss.backward()
    grads = [p.grad for p in net.parameters() if p.grad is not None]
    assert torch.isfinite(loss) and grads and all(torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize("max_displacement", [0, 1, 5, 12, 40])
def test_vectorised_correlation_equals_the_per_displacement_loop(max_displacement):
    g = torch.Generator().manual_seed(max_displacement)
    left = torch.randn(2, 7, 5, 13, generator=g, requires_grad=True)
    right = torch.randn(2, 7, 5, 13, generator=g, requires_grad=True)
    fast = correlation_1d(left, right, max_displacement)
    slow = correlation_1d_loop(left, right, max_displacement)
    assert fast.shape == (2, max_displacement + 1, 5, 13)
    assert torch.allclose(fast, slow, atol=1e-6)
    weights = torch.randn(fast.shape, generator=g)
    grad_fast = torch.autograd.grad((fast * weights).sum(), (left, right))
    grad_slow = torch.autograd.grad((slow * weights).sum(), (left, right))
    for a, b in zip(grad_fast, grad_slow, strict=True):
        assert torch.allclose(a, b, atol=1e-5)


def test_correlation_peaks_at_the_true_shift():
    g = torch.Generator().manual_seed(0)
    right = torch.randn(1, 16, 4, 40, generator=g)
    shift = 3
    left = torch.zeros_like(right)
    left[..., shift:] = right[..., :-shift]  # left(x) = right(x - 3)
    cost = correlation_1d(left, right, 6)
    assert (cost[0, :, :, shift:].argmax(0) == shift).all()


def test_export_equals_the_supernet_on_many_random_configs():
    net = tiny_net()
    _randomise_bn(net)
    net.eval()
    left, right = _pair(batch=2, height=64, width=64, seed=3)
    rng = random.Random(0)
    configs = [net.largest_config(), net.smallest_config()] + [net.sample_config(rng) for _ in range(10)]
    worst = 0.0
    for cfg in configs:
        net.set_active(cfg)
        expected = net.multiscale(left, right)
        static = net.export(cfg)
        assert isinstance(static, StaticStereo) and not static.training
        got = static.multiscale(left, right)
        for a, b in zip(expected, got, strict=True):
            worst = max(worst, (a - b).abs().max().item())
        assert torch.equal(static(left, right), got[-1])
    assert worst <= 1e-5, worst


def test_exported_torchscript_loads_and_runs_without_manta(tmp_path):
    net = tiny_net()
    _randomise_bn(net)
    cfg = net.sample_config(7)
    net.set_active(cfg).eval()
    left, right = _pair(batch=1, height=64, width=128, seed=4)
    expected = net(left, right)
    path = save_torchscript(net.export(cfg), tmp_path / "stereo.pt")
    torch.save({"left": left, "right": right}, tmp_path / "inputs.pt")
    code = textwrap.dedent(f"""
        import sys
        for name in ("supernet", "tasks", "protocol", "peer", "aggregator"):
            sys.modules[name] = None  # any import of MANTA fails
        import torch
        model = torch.jit.load({str(path)!r})
        inputs = torch.load({str(tmp_path / "inputs.pt")!r})
        out = model(inputs["left"], inputs["right"])
        assert len(model.multiscale(inputs["left"], inputs["right"])) == 7
        torch.save(out, {str(tmp_path / "out.pt")!r})
    """)
    subprocess.run([sys.executable, "-I", "-c", code], check=True, cwd=tmp_path, timeout=120)
    out = torch.load(tmp_path / "out.pt")
    assert (out - expected).abs().max().item() <= 1e-5


def test_flops_match_torch_flop_counter_on_the_export():
    net = tiny_net()
    rng = random.Random(1)
    left, right = _pair(batch=1, height=64, width=128)
    values = {}
    for name, cfg in [("largest", net.largest_config()), ("smallest", net.smallest_config())] + [
        (f"random{i}", net.sample_config(rng)) for i in range(3)
    ]:
        exported = net.export(cfg)
        with FlopCounterMode(display=False) as counter:
            exported(left, right)
        values[name] = net.flops(cfg, (64, 128))
        assert 2 * values[name] == counter.get_total_flops(), name
    assert values["largest"] > values["smallest"] > 0
    assert net.flops(net.largest_config(), (128, 128)) > values["largest"]
    with pytest.raises(ValueError, match="multiple"):
        net.flops(net.largest_config(), (60, 128))


def test_parameter_masks_cover_exactly_the_gradients_of_a_subnet():
    net = tiny_net()
    _randomise_bn(net)
    cfg = net.sample_config(11)
    net.set_active(cfg).train()
    masks = net.parameter_masks(cfg)
    params = dict(net.named_parameters())
    assert masks.keys() == params.keys()
    assert all(masks[k].shape == p.shape and masks[k].dtype == torch.bool for k, p in params.items())
    left, right = _pair(batch=2, height=64, width=64)
    sum(o.square().mean() for o in net(left, right)).backward()
    exact = net.parameter_masks(cfg, input_size=(64, 64))  # also drops taps that only meet padding
    for name, p in params.items():
        assert not (exact[name] & ~masks[name]).any(), name
        if p.grad is not None:
            assert not (p.grad[~exact[name]] != 0).any(), name
    assert sum(int(m.sum()) for m in exact.values()) < sum(int(m.sum()) for m in masks.values())
    used = {name: int(m.sum()) for name, m in masks.items()}
    assert all(v == masks[k].numel() for k, v in used.items() if not k.startswith("units."))
    largest = net.parameter_masks(net.largest_config())
    smallest = net.parameter_masks(net.smallest_config())
    # The largest sub-network uses everything but the kernel-transformation matrices (7×7 needs none).
    assert all(m.all() for k, m in largest.items() if "kernel_transforms" not in k)
    assert sum(int(m.sum()) for m in largest.values()) > sum(int(m.sum()) for m in smallest.values())


def test_recalibrate_bn_sets_statistics_for_the_chosen_subnet():
    net = tiny_net()
    cfg = net.smallest_config()
    batches = [{"left": left, "right": right} for left, right in (_pair(2, 64, 64, seed=s) for s in range(3))]
    net.recalibrate_bn(cfg, batches, num_batches=3)
    assert net.active == cfg and net.training
    stem_bn = net.stem[1]
    assert stem_bn.num_batches_tracked.item() == 3 and stem_bn.running_var.mean() != 1.0


def test_left_and_right_of_different_sizes_are_a_clear_error():
    net = tiny_net()
    left, _ = _pair(1, 64, 128)
    _, right = _pair(1, 64, 64)
    with pytest.raises(ValueError, match="differ in size"):
        net(left, right)
    with pytest.raises(ValueError, match="differ in size"):
        predict_disparity(net.eval(), left, right)
    with pytest.raises(ValueError, match="3 channels"):
        net(left[:, :1], left[:, :1])
    with pytest.raises(ValueError, match="B×3×H×W"):
        net(left[0], left[0])


def test_sizes_the_stride_does_not_divide_are_rejected_or_padded():
    net = tiny_net().eval()
    left, right = _pair(1, 70, 100)
    with pytest.raises(ValueError, match="multiple of the network stride 64"):
        net(left, right)
    with pytest.raises(ValueError, match="stride"):
        net.export()(left, right)
    out = predict_disparity(net, left, right)
    assert out.shape == (1, 1, 70, 100) and torch.isfinite(out).all()
    single = predict_disparity(net.export(), left[0], right[0])
    assert single.shape == (1, 70, 100)
    assert torch.allclose(single, out[0], atol=1e-5)
    # A size that already divides goes through unchanged.
    left, right = _pair(1, 64, 64)
    assert torch.equal(predict_disparity(net, left, right), net(left, right))


def test_a_training_batch_too_small_for_batch_norm_is_a_clear_error():
    net = tiny_net().train()
    left, right = _pair(1, 64, 64)  # the 1/64 bottleneck would hold a single value per channel
    with pytest.raises(ValueError, match="batch norm"):
        net(left, right)
    net.eval()
    assert net(left, right).shape == (1, 1, 64, 64)  # fine for inference
