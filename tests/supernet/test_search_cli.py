"""``manta-search``: a whole run with export (classification and stereo), the exported model loading in
a clean interpreter that cannot import MANTA, and one-line errors for bad input."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch
from click.testing import CliRunner

from supernet.checkpoint import load_checkpoint, save_trained
from supernet.config import SubnetConfig
from supernet.export_choice import format_of
from supernet.search.accuracy import DirectEvaluator
from supernet.search.cli import main
from supernet.search.deploy import recalibrated_export
from supernet.search.run import SearchOptions, run_search
from supernet.search.timing import example_inputs
from supernet.training.loop import train
from supernet.workload import workload_for
from tests.helpers import REFUSE_MANTA_IMPORTS, console_script
from tests.supernet.threads import single_torch_thread  # noqa: F401

TINY = dict(width_mult=0.25, head_channels=64, channel_divisor=4)
FAST = ["--evaluations", "6", "--population", "3", "--val-samples", "40", "--bn-batches", "1",
        "--latency-repeats", "3", "--quiet"]  # fmt: skip


@pytest.fixture(scope="module")
def digits_checkpoint(tmp_path_factory):
    workload = workload_for("digits", dict(TINY, total_steps=4, batch_size=32, bn_calibration_batches=1,
                                           eval_random_subnets=0, log_every=0))  # fmt: skip
    result = train(workload.cfg, workload.task, progress=lambda line: None)
    return save_trained(
        tmp_path_factory.mktemp("digits") / "digits.pt", workload, result["net"], round_index=5
    )


@pytest.fixture(scope="module")
def stereo_checkpoint(tmp_path_factory):
    options = dict(unit_channels=(8, 8, 16, 16, 16, 16), stem_channels=8, max_displacement=2,
                   bn_calibration_batches=1, eval_batch_size=8,
                   task_options=dict(train_size=32, val_size=4, height=64, width=64))  # fmt: skip
    workload = workload_for("stereo-synthetic", options)
    return save_trained(tmp_path_factory.mktemp("stereo") / "stereo.pt", workload, workload.build())


def invoke(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


# A clean interpreter: -I (no user site, no PYTHONPATH, not the current directory) and an import
# hook that refuses MANTA's packages, so only torch can be used to load the model.
CLEAN = REFUSE_MANTA_IMPORTS + textwrap.dedent(
    """
    import torch, json, warnings
    warnings.simplefilter("ignore")
    model = torch.jit.load(sys.argv[1])
    inputs = torch.load(sys.argv[2])
    out = model(*inputs)
    try:
        import supernet
        raise SystemExit("supernet was importable")
    except ImportError:
        pass
    assert not any(m.split(".")[0] == "supernet" for m in sys.modules)
    print(json.dumps(out.flatten().tolist()))
    """
)


def run_clean(model_path, inputs, tmp_path) -> torch.Tensor:
    inputs_path = tmp_path / "inputs.pt"
    torch.save(inputs, inputs_path)
    done = subprocess.run(
        [sys.executable, "-I", "-c", CLEAN, str(model_path), str(inputs_path)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return torch.tensor(json.loads(done.stdout))


def test_search_prints_the_choice_and_exports_a_model_that_loads_without_manta(digits_checkpoint, tmp_path):
    loaded = load_checkpoint(digits_checkpoint)
    budget = 0.6 * loaded.net.flops(loaded.net.largest_config(), (1, 32, 32)) / 1e6
    out = tmp_path / "out"
    result = invoke("--checkpoint", str(digits_checkpoint), "--max-mflops", f"{budget}", "--task", "digits",
                    "--export", str(out / "subnet.pt"), "--plot", str(out / "front.png"), "--json",
                    str(out / "report.json"), "--latency-table", str(tmp_path / "lat.json"), "--random-baseline",
                    *FAST)  # fmt: skip
    assert result.exit_code == 0, result.output
    text = result.stdout
    for expected in (
        "chosen:",
        "accuracy",
        "FLOPs",
        "predicted",
        "measured",
        "Pareto front",
        "random search",
    ):
        assert expected in text
    info = json.loads((out / "subnet.json").read_text())
    report = json.loads((out / "report.json").read_text())
    cfg = SubnetConfig.from_dict(info["config"], loaded.net.space)
    assert info["hash"] == cfg.hash == report["chosen"]["hash"]
    assert info["mflops"] <= budget and report["searches"][0]["evaluations"] == 6
    assert info["latency_ms"]["predicted"] > 0 and info["latency_ms"]["measured"] > 0
    assert (
        info["input"]["arguments"]["x"] == ["B", 1, 32, 32] and "normalize" in info["input"]["preprocessing"]
    )
    assert (out / "front.png").read_bytes()[:4] == b"\x89PNG"
    assert report["exported"]["max_abs_difference"] == 0.0

    # The file is the chosen sub-network with recalibrated BN: it matches a fresh export, run by torch alone.
    _, model = recalibrated_export(loaded.workload, loaded.net, cfg)
    inputs = (torch.rand(3, 1, 32, 32),)
    expected = model(*inputs).flatten()
    torch.testing.assert_close(run_clean(out / "subnet.pt", inputs, tmp_path), expected, rtol=1e-5, atol=1e-6)
    assert (tmp_path / "lat.json").exists()  # saved for the next run (reuse: tests/supernet/test_search.py)


def test_the_export_format_follows_the_files_suffix():
    assert [format_of(n) for n in ("m.onnx", "M.ONNX", "m.pt2", "m.pt", "m", "dir.onnx/m.ts")] == [
        "onnx", "onnx", "export", "torchscript", "torchscript", "torchscript"
    ]  # fmt: skip


# 28 s. By default: the suffix rule above, the formats test (tests/supernet/test_export_formats.py:
# an ONNX file checked in onnxruntime against the supernet) and the search's export path above.
@pytest.mark.slow
def test_search_exports_onnx_by_the_suffix_checked_against_the_supernet(digits_checkpoint, tmp_path):
    import onnx
    import onnxruntime

    result = invoke("--checkpoint", str(digits_checkpoint), "--max-mflops", "100", "--export",
                    str(tmp_path / "subnet.onnx"), "--json", str(tmp_path / "report.json"),
                    "--latency-table", str(tmp_path / "lat.json"), *FAST)  # fmt: skip
    assert result.exit_code == 0, result.output
    assert f"exported: {tmp_path / 'subnet.onnx'} (onnx)" in result.stdout
    exported = json.loads((tmp_path / "report.json").read_text())["exported"]
    assert exported["format"] == "onnx" and exported["check_samples"] == 8
    assert exported["supernet_max_abs_difference"] <= exported["tolerance"] == 1e-4
    info = json.loads((tmp_path / "subnet.json").read_text())
    assert info["model_format"] == "onnx" and info["load"] == "onnxruntime.InferenceSession('subnet.onnx')"

    # The file passes onnx's checker and, in onnxruntime, answers as a fresh export of its config does.
    onnx.checker.check_model(onnx.load(tmp_path / "subnet.onnx"), full_check=True)
    loaded = load_checkpoint(digits_checkpoint)
    _, model = recalibrated_export(
        loaded.workload, loaded.net, SubnetConfig.from_dict(info["config"], loaded.net.space)
    )
    x = torch.rand(3, 1, 32, 32)
    session = onnxruntime.InferenceSession(str(tmp_path / "subnet.onnx"), providers=["CPUExecutionProvider"])
    got = torch.from_numpy(session.run(None, {"x": x.numpy()})[0])
    torch.testing.assert_close(got, model(x).detach(), rtol=1e-4, atol=1e-5)
    assert abs(exported["reloaded_metric"] - info["metric"]["value"]) < 1e-6


@pytest.mark.slow  # about 9 s: TorchScript-compiling the stereo network dominates
def test_stereo_search_under_a_latency_budget_exports_a_loadable_model(stereo_checkpoint, tmp_path):
    result = invoke("--checkpoint", str(stereo_checkpoint), "--max-latency-ms", "1000", "--export",
                    str(tmp_path / "stereo.pt"), "--latency-table", str(tmp_path / "lat.json"),
                    *FAST[:4], "--bn-batches", "1", "--latency-repeats", "3", "--quiet")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "epe" in result.stdout and "chosen:" in result.stdout
    info = json.loads((tmp_path / "stereo.json").read_text())
    assert info["family"] == "stereo" and info["metric"]["name"] == "epe"
    inputs = example_inputs("stereo", (64, 64), torch.device("cpu"))
    disparity = run_clean(tmp_path / "stereo.pt", inputs, tmp_path)
    assert disparity.numel() == 64 * 64 and torch.isfinite(disparity).all()


def test_run_search_with_helpers_gives_the_same_result(digits_checkpoint, tmp_path):
    options = SearchOptions(digits_checkpoint, max_mflops=1.0, evaluations=4, population=2, val_samples=20,
                            bn_batches=1, latency_table=tmp_path / "lat.json", latency_repeats=2)  # fmt: skip
    alone = run_search(options, say=lambda line: None)
    loaded = [load_checkpoint(digits_checkpoint) for _ in range(2)]
    helpers = [DirectEvaluator(c.workload, c.net, val_samples=20, bn_batches=1) for c in loaded]
    shared = run_search(options, say=lambda line: None, helpers=helpers)
    assert [(c.hash, c.metric) for c in shared.searches[0].candidates] == [
        (c.hash, c.metric) for c in alone.searches[0].candidates
    ]
    assert shared.chosen.hash == alone.chosen.hash and all(h.count > 0 for h in helpers)


# --------------------------------------------------------------------------------------------------
# Bad input: one line, exit status 1, no traceback
# --------------------------------------------------------------------------------------------------


def one_line_error(result, *fragments: str) -> str:
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0]
    return lines[0]


def test_checkpoint_of_another_task_version_or_no_checkpoint(digits_checkpoint, tmp_path):
    args = ["--max-mflops", "1", "--quiet"]
    one_line_error(invoke("--checkpoint", str(digits_checkpoint), "--task", "stereo-synthetic", *args),
                   "checkpoint of task 'digits', not 'stereo-synthetic'")  # fmt: skip
    payload = torch.load(digits_checkpoint, weights_only=True)
    payload["version"] = 99
    torch.save(payload, tmp_path / "future.pt")
    one_line_error(invoke("--checkpoint", str(tmp_path / "future.pt"), *args), "version 99")
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    one_line_error(invoke("--checkpoint", str(tmp_path / "junk.pt"), *args), "is not a MANTA checkpoint")
    one_line_error(invoke("--checkpoint", str(tmp_path / "missing.pt"), *args), "does not exist")


def test_unknown_or_absent_device_and_bad_budgets(digits_checkpoint, tmp_path):
    ckpt = ["--checkpoint", str(digits_checkpoint), "--quiet", "--latency-repeats", "2",
            "--latency-table", str(tmp_path / "lat.json")]  # fmt: skip
    one_line_error(invoke(*ckpt, "--max-mflops", "1", "--device", "tpu"), "unknown device 'tpu'")
    if not torch.cuda.is_available():
        one_line_error(invoke(*ckpt, "--max-mflops", "1", "--device", "cuda"), "no CUDA device")
    one_line_error(invoke(*ckpt, "--max-mflops", "0.001"), "infeasible budget", "smallest sub-network")
    one_line_error(invoke(*ckpt, "--max-latency-ms", "0.0001"), "infeasible budget", "ms")
    one_line_error(invoke(*ckpt), "exactly one budget")
    one_line_error(invoke(*ckpt, "--max-mflops", "1", "--max-latency-ms", "5"), "exactly one budget")
    one_line_error(invoke(*ckpt, "--max-mflops", "-3"), "positive")
    one_line_error(invoke(*ckpt, "--max-mflops", "1", "--accuracy", "oracle"), "--accuracy")
    one_line_error(invoke(*ckpt, "--max-mflops", "1", "--export", str(tmp_path / "m.json")), "model file")


def test_installed_script_reports_bad_input_in_one_line(digits_checkpoint):
    done = subprocess.run(
        [console_script("manta-search"), "--checkpoint", str(digits_checkpoint), "--task", "cifar10",
         "--max-mflops", "1"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [
        f"Error: {digits_checkpoint} is a checkpoint of task 'digits', not 'cifar10' (--task)"
    ]


def test_search_on_an_operators_packed_data_evaluates_its_validation_split(tmp_path):
    """A checkpoint of an ``imagefolder`` task: ``--data`` names the directory the aggregator packed
    the folder into; without it, or with another directory, one line says what is missing."""
    from aggregator.task_data import pack_into
    from aggregator.task_publication import DataRequest
    from tasks.shards.local import open_shard_directory
    from testbed.image_folder import make_image_folder

    images = make_image_folder(tmp_path / "images", 200, size=16)
    spec = pack_into(lambda _id: tmp_path / "agg")(
        "t", 0, DataRequest("imagefolder", images, shard_samples=50)
    )
    task = open_shard_directory(tmp_path / "agg")
    assert len(task.val_set) == spec.val_samples
    workload = workload_for("imagefolder", dict(TINY, bn_calibration_batches=1), task=task)
    checkpoint = save_trained(tmp_path / "folder.pt", workload, workload.build())
    found = invoke("--checkpoint", str(checkpoint), "--data", str(tmp_path / "agg"), "--max-mflops", "100",
                   "--json", str(tmp_path / "r.json"), *FAST)  # fmt: skip
    assert found.exit_code == 0, found.output
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["task"] == "imagefolder"
    for args, says in [((), "data directory"), (("--data", str(tmp_path)), "no data.json")]:
        refused = invoke("--checkpoint", str(checkpoint), "--max-mflops", "100", *args, *FAST)
        assert (
            refused.exit_code == 1
            and says in refused.output
            and len(refused.output.strip().splitlines()) == 1
        )
