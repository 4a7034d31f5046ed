"""Shipping the chosen sub-network: recalibrate, export, save it plus a config JSON, check the file.

The saved model is the standalone plain-torch sub-network (``supernet.export``) as TorchScript, a
``torch.export`` program or ONNX, by the file's suffix (:mod:`supernet.export_formats`), so it runs in
a process that has torch (or onnxruntime) but not MANTA. The JSON beside it says what it is (config
and hash, task, metric, FLOPs, latency), how to load it and how to feed it. :func:`supernet_difference`
compares the file, loaded by its format's own tool, with the supernet on validation samples.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from supernet.config import SubnetConfig
from supernet.export_formats import format_of, load_command, save_model
from supernet.training.evaluation import evaluate
from supernet.workload import Workload

__all__ = [
    "CHECK_SAMPLES",
    "TOLERANCE",
    "check_batch",
    "evaluate_model",
    "input_description",
    "input_names",
    "load_torchscript",
    "recalibrated_export",
    "save_subnet",
    "supernet_difference",
]

FORMAT = "manta-subnet"
VERSION = 1
CHECK_SAMPLES = 8  # validation samples an exported file is checked on
# The largest |file's output - supernet's output| allowed, times max(1, largest |supernet output|):
# probabilities for classification, disparities in pixels for stereo. Measured: 0 for TorchScript
# and torch.export, under 1e-5 for ONNX in onnxruntime.
TOLERANCE = 1e-4


def recalibrated_export(
    workload: Workload, net: nn.Module, cfg: SubnetConfig
) -> tuple[dict[str, Any], nn.Module]:
    """Evaluate ``cfg`` on the full validation set after BN recalibration, then export it with those
    statistics. Returns (the evaluation row of :meth:`Workload.evaluate`, the standalone model)."""
    row = workload.evaluate(net, {"chosen": cfg})[0]  # leaves the BN statistics of cfg in net
    return row, net.export(cfg)


@torch.no_grad()
def evaluate_model(workload: Workload, model: nn.Module) -> float:
    """The task metric of a standalone (exported or reloaded) model on the full validation set."""
    if workload.family == "stereo":
        from supernet.stereo_training import evaluate_stereo

        return float(evaluate_stereo(model, workload.task.val_set, workload.cfg.eval_batch_size)["epe"])

    task = workload.task
    return float(evaluate(model, task.val_set, task.metric, workload.cfg.eval_batch_size))


def input_description(workload: Workload) -> dict[str, Any]:
    """How to call the exported model: argument shapes and the preprocessing the task applies."""
    task = workload.task
    if workload.family == "stereo":
        height, width = workload.input_size
        return {
            "call": "model(left, right) -> disparity B×1×H×W in pixels (left-referenced)",
            "arguments": {"left": ["B", 3, height, width], "right": ["B", 3, height, width]},
            "preprocessing": "RGB in [0, 1]; H and W multiples of 64 (the model normalises internally)",
        }
    description: dict[str, Any] = {
        "call": "model(x) -> class probabilities B×classes (model.logits(x) for logits)",
        "arguments": {"x": ["B", *task.input_size]},
        "classes": list(task.classes),
    }
    transform = getattr(task.val_set, "transform", None)
    for step in getattr(transform, "transforms", [transform]):
        if type(step).__name__ == "Normalize":
            description["preprocessing"] = {
                "scale": "pixel values in [0, 1]",
                "normalize": {"mean": list(step.mean), "std": list(step.std)},
            }
    return description


def input_names(workload: Workload) -> list[str]:
    """The model's argument names: ``["x"]``, or ``["left", "right"]`` for stereo."""
    return ["left", "right"] if workload.family == "stereo" else ["x"]


def check_batch(workload: Workload, samples: int = CHECK_SAMPLES) -> tuple[torch.Tensor, ...]:
    """The first ``samples`` validation inputs, as the model takes them: ``(x,)`` or ``(left, right)``."""
    dataset = workload.task.val_set
    indices = range(min(samples, len(dataset)))
    if workload.family == "stereo":
        from supernet.stereo_training import stereo_batch

        batch = stereo_batch(dataset, list(indices))
        return batch["left"], batch["right"]
    return (torch.stack([dataset[i][0] for i in indices]),)


@torch.no_grad()
def supernet_difference(
    net: nn.Module, cfg: SubnetConfig, model: nn.Module, inputs: tuple[torch.Tensor, ...]
) -> tuple[float, float]:
    """(largest |model(inputs) - supernet(inputs)| with ``cfg`` active in eval mode, the allowed
    bound: :data:`TOLERANCE` × max(1, largest |supernet output|)). ``net`` keeps its mode and config."""
    was_training, active = net.training, net.active
    try:
        reference = net.eval().set_active(cfg)(*inputs)
    finally:
        net.train(was_training).set_active(active)
    output = torch.as_tensor(model(*inputs)).to(reference.dtype)
    if output.shape != reference.shape:
        return float("inf"), 0.0
    bound = TOLERANCE * max(1.0, float(reference.abs().max()))
    return float((output - reference).abs().max()), bound


def save_subnet(
    model: nn.Module,
    path: str | Path,
    info: dict[str, Any],
    inputs: tuple[torch.Tensor, ...] | None = None,
    names: list[str] | None = None,
) -> tuple[Path, Path]:
    """Save ``model`` at ``path`` in the format its suffix names (:func:`format_of`; ``inputs``, an
    example batch, and ``names``, the arguments' names, are needed for ``.pt2`` and ``.onnx``) and
    ``info`` (plus format fields) as JSON beside it (same name, ``.json`` suffix). Returns both paths."""
    path = Path(path)
    if path.suffix == ".json":
        raise ValueError(
            f"--export {path}: give the model file (e.g. model.pt); the JSON is written beside it"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    json_path = path.with_suffix(".json")
    fmt = format_of(path)
    save_model(model, path, fmt, inputs or (), names or [])
    payload = {
        "format": FORMAT,
        "version": VERSION,
        "model_file": path.name,
        "model_format": fmt,
        "load": load_command(fmt, path.name),
        **info,
    }
    tmp = json_path.with_name(f".{json_path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, json_path)
    return path, json_path


def load_torchscript(path: str | Path) -> torch.jit.ScriptModule:
    """``torch.jit.load`` without the upstream deprecation warning (TorchScript still works)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return torch.jit.load(str(path), map_location="cpu")
