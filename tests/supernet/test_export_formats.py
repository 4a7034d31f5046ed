"""A sub-network shipped as TorchScript, a ``torch.export`` program and ONNX: each file is written by the
code ``manta-search --export`` runs, opened by its format's own tool in an interpreter that cannot
import MANTA (``torch.jit.load``, ``torch.export.load(...).module()``, ``onnx.checker.check_model``
and ``onnxruntime``), and computes what the supernet computes."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn

from supernet.export_formats import format_of, load_model, missing_packages
from supernet.search.deploy import check_batch, input_names, save_subnet, supernet_difference
from supernet.workload import workload_for
from tests.helpers import REFUSE_MANTA_IMPORTS
from tests.supernet.threads import single_torch_thread  # noqa: F401

TINY = dict(width_mult=0.25, head_channels=64, channel_divisor=4)
STEREO = dict(unit_channels=(8, 8, 16, 16, 16, 16), stem_channels=8, max_displacement=2,
              task_options=dict(train_size=8, val_size=4, height=64, width=64))  # fmt: skip
FILES = {"torchscript": "subnet.pt", "export": "subnet.pt2", "onnx": "subnet.onnx"}

# Each file opened by its own tool only: MANTA's packages cannot be imported.
OPEN_WITHOUT_MANTA = REFUSE_MANTA_IMPORTS + textwrap.dedent(
    """
    import json, warnings
    import numpy, onnx, onnxruntime, torch
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    inputs = torch.load("inputs.pt")
    out = {}
    with torch.no_grad():
        out["torchscript"] = torch.jit.load("subnet.pt")(*inputs)
        out["export"] = torch.export.load("subnet.pt2").module()(*inputs)
    model = onnx.load("subnet.onnx")
    onnx.checker.check_model(model, full_check=True)
    session = onnxruntime.InferenceSession("subnet.onnx", providers=["CPUExecutionProvider"])
    feeds = {i.name: t.numpy() for i, t in zip(session.get_inputs(), inputs)}
    out["onnx"] = torch.from_numpy(session.run(None, feeds)[0])
    out["onnx_inputs"] = [i.name for i in model.graph.input]
    torch.save(out, "outputs.pt")
    """
)


def perturbed(net: nn.Module, seed: int = 1) -> nn.Module:
    """Every weight and BN statistic moved off its initial value (a zero-initialised classifier
    answers 0.1 for every class, which any file would match)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in net.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g))
        for m in net.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.running_mean.copy_(0.1 * torch.randn(m.running_mean.shape, generator=g))
                m.running_var.copy_(0.5 + torch.rand(m.running_var.shape, generator=g))
    return net.eval()


def export_every_format(workload, tmp_path):
    """A random sub-network of a perturbed supernet, saved in each format as manta-search does;
    returns (net, cfg, check batch, expected output)."""
    net = perturbed(workload.build())
    cfg = net.sample_config(random.Random(3))
    model = net.export(cfg)
    batch = check_batch(workload)
    for fmt, name in FILES.items():
        path, json_path = save_subnet(
            model, tmp_path / name, {"task": workload.cfg.task}, batch, input_names(workload)
        )
        assert format_of(path) == fmt and json.loads(json_path.read_text())["model_format"] == fmt
    with torch.no_grad():
        expected = net.set_active(cfg)(*batch)
    return net, cfg, batch, expected


def check_files(net, cfg, batch, expected, tmp_path) -> tuple[dict, dict]:
    """Open the files without MANTA and compare each with ``expected``, then check them as manta-search
    does; returns (what the child read, the files as the product's loader opens them)."""
    torch.save(batch, tmp_path / "inputs.pt")
    done = subprocess.run([sys.executable, "-I", "-c", OPEN_WITHOUT_MANTA], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    out = torch.load(tmp_path / "outputs.pt")
    bound = 1e-4 * max(1.0, float(expected.abs().max()))
    loaded = {}
    for fmt, name in FILES.items():
        assert out[fmt].shape == expected.shape, fmt
        assert (out[fmt] - expected).abs().max().item() <= bound, fmt
        loaded[fmt] = load_model(tmp_path / name, fmt)
        difference, allowed = supernet_difference(net, cfg, loaded[fmt], batch)
        assert difference <= allowed == bound, fmt
    return out, loaded


def test_a_digits_subnetwork_in_each_format_opens_in_its_own_tool_and_matches_the_supernet(tmp_path):
    workload = workload_for("digits", TINY)
    net, cfg, batch, expected = export_every_format(workload, tmp_path)
    assert expected.shape == (8, 10) and expected.std() > 0.01  # a real answer, not a uniform one
    out, loaded = check_files(net, cfg, batch, expected, tmp_path)
    assert out["onnx_inputs"] == ["x"]
    # the batch dimension is dynamic in every format
    with torch.no_grad():
        for fmt, model in loaded.items():
            assert model(batch[0][:1]).shape == (1, 10), fmt


def test_a_file_of_another_subnetwork_is_told_apart(tmp_path):
    workload = workload_for("digits", TINY)
    net = perturbed(workload.build())
    batch = check_batch(workload)
    other = net.export(net.largest_config())
    difference, allowed = supernet_difference(net, net.smallest_config(), other, batch)
    assert difference > allowed


def test_a_missing_onnx_package_is_named_before_the_search(tmp_path):
    # The packages are blocked in a child interpreter; the command then stops at once with one line.
    code = textwrap.dedent(
        """
        import sys
        sys.modules["onnxscript"] = None
        from supernet.search.cli import main
        main()
        """
    )
    (tmp_path / "c.pt").write_bytes(b"never read: the options are checked first")
    done = subprocess.run([sys.executable, "-c", code, "--checkpoint", str(tmp_path / "c.pt"),
                           "--max-mflops", "1", "--export", str(tmp_path / "m.onnx")],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        f"Error: --export {tmp_path / 'm.onnx'}: onnx export needs onnxscript: pip install onnxscript"
    ]
    assert missing_packages("onnx") == [] and missing_packages("export") == []


@pytest.mark.slow  # 80 s: the stereo network exported three ways; the same code: the digits test above
def test_a_stereo_subnetwork_in_each_format_opens_in_its_own_tool_and_matches_the_supernet(tmp_path):
    workload = workload_for("stereo-synthetic", STEREO)
    net, cfg, batch, expected = export_every_format(workload, tmp_path)
    assert expected.shape == (4, 1, 64, 64)
    out, _ = check_files(net, cfg, batch, expected, tmp_path)
    assert out["onnx_inputs"] == ["left", "right"]
