"""Shipping the chosen sub-network: recalibrate, export, save as TorchScript plus a config JSON.

The saved model is a TorchScript archive of the standalone plain-torch sub-network
(``supernet.export``), so ``torch.jit.load(path)`` runs it in a process that has torch but not MANTA.
The JSON beside it says what it is (config and hash, task, metric, FLOPs, latency) and how to feed it.
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
from supernet.export import save_torchscript
from supernet.training.evaluation import evaluate
from supernet.workload import Workload

__all__ = [
    "evaluate_model",
    "input_description",
    "load_torchscript",
    "recalibrated_export",
    "save_subnet",
]

FORMAT = "manta-subnet"
VERSION = 1


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


def save_subnet(model: nn.Module, path: str | Path, info: dict[str, Any]) -> tuple[Path, Path]:
    """Save ``model`` as TorchScript at ``path`` and ``info`` (plus format fields) as JSON beside it
    (same name, ``.json`` suffix). Returns both paths."""
    path = Path(path)
    if path.suffix == ".json":
        raise ValueError(
            f"--export {path}: give the model file (e.g. model.pt); the JSON is written beside it"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    json_path = path.with_suffix(".json")
    save_torchscript(model, path)
    payload = {
        "format": FORMAT,
        "version": VERSION,
        "model_file": path.name,
        "load": f"torch.jit.load({path.name!r})",
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
