"""Standalone (static) sub-networks: plain torch layers, and saving/loading them without MANTA.

``ClassificationSupernet.export(cfg)`` (and the elastic ops' ``export`` methods) build models from
the classes here, with the kernel-transformation matrices already applied to the copied weights and
with the batch-norm running statistics copied. The classes only use ``torch.nn`` layers, so a model
can be saved as a TorchScript archive (:func:`save_torchscript`), a ``torch.export`` program
(:func:`save_exported_program`) or an ONNX model (:func:`save_onnx`) and loaded by a process that has
torch (or, for ONNX, onnxruntime) but not MANTA::

    model = torch.jit.load("subnet.pt")                   # TorchScript
    model = torch.export.load("subnet.pt2").module()      # torch.export
    session = onnxruntime.InferenceSession("subnet.onnx") # ONNX
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
from torch import nn

__all__ = [
    "InvertedResidual",
    "StaticClassifier",
    "make_activation",
    "save_torchscript",
    "save_exported_program",
    "save_onnx",
]

_ACTIVATIONS = {"relu": nn.ReLU, "relu6": nn.ReLU6, "hswish": nn.Hardswish, "silu": nn.SiLU}


def make_activation(name: str) -> nn.Module:
    """A fresh activation module by name: ``relu``, ``relu6``, ``hswish`` or ``silu``."""
    try:
        return _ACTIVATIONS[name]()
    except KeyError:
        raise ValueError(f"activation: unknown {name!r} (choose from {', '.join(_ACTIVATIONS)})") from None


class InvertedResidual(nn.Module):
    """A static MBConv block: ``body`` (expand 1×1, depthwise k×k, project 1×1) plus identity shortcut."""

    def __init__(self, body: nn.Sequential, residual: bool) -> None:
        super().__init__()
        self.body = body
        self.residual = residual

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.body(x)
        if self.residual:
            out = out + x
        return out


class StaticClassifier(nn.Module):
    """A deployed classification sub-network; ``forward`` returns softmax probabilities.

    ``logits(x)`` gives the pre-softmax scores (e.g. for fine-tuning with a cross-entropy loss).
    """

    def __init__(self, stem: nn.Module, units: nn.ModuleList, head: nn.Module, classifier: nn.Linear) -> None:
        super().__init__()
        self.stem = stem
        self.units = units
        self.head = head
        self.classifier = classifier

    @torch.jit.export
    def logits(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for unit in self.units:
            x = unit(x)
        x = self.head(x)
        x = torch.flatten(torch.mean(x, dim=(2, 3)), 1)
        return self.classifier(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.logits(x), dim=1)


def save_torchscript(model: nn.Module, path: str | Path) -> Path:
    """Script ``model`` (eval mode) and save it; load with ``torch.jit.load(path)``."""

    path = Path(path)
    model = model.eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.jit is deprecated upstream, still works
        scripted = torch.jit.script(model)
    scripted.save(str(path))
    return path


def _as_tuple(inputs: torch.Tensor | tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    return inputs if isinstance(inputs, tuple) else (inputs,)


def save_exported_program(
    model: nn.Module, path: str | Path, example_input: torch.Tensor | tuple[torch.Tensor, ...]
) -> Path:
    """``torch.export`` ``model`` in eval mode and save it; load with ``torch.export.load(path).module()``.

    ``example_input``: a batch (a tuple of them for a model of several inputs, e.g. stereo's left and
    right); the batch dimension is exported as dynamic, so the loaded program takes any batch size.
    """
    path = Path(path)
    model = model.eval()
    inputs = _as_tuple(example_input)
    batch = torch.export.Dim("batch", min=1)
    program = torch.export.export(model, inputs, dynamic_shapes=tuple({0: batch} for _ in inputs))
    with warnings.catch_warnings():
        # torch 2.15 says this while saving the stereo network's weights, all on the CPU, "may cause
        # issues" off the CPU; the saved program computes what the model does (tests/supernet/test_export_formats.py)
        warnings.filterwarnings("ignore", "No complete tensor found", UserWarning)
        torch.export.save(program, str(path))
    return path


def save_onnx(
    model: nn.Module,
    path: str | Path,
    example_input: torch.Tensor | tuple[torch.Tensor, ...],
    input_names: list[str],
    opset: int = 18,
) -> Path:
    """Export ``model`` in eval mode to ONNX (opset ``opset``) with ``torch.onnx``'s ``torch.export``-based
    exporter (needs the ``onnx`` and ``onnxscript`` packages); inputs named ``input_names``, output
    ``output``, the batch dimension dynamic. Load with ``onnxruntime.InferenceSession(path)``."""
    path = Path(path)
    model = model.eval()
    inputs = _as_tuple(example_input)
    batch = torch.export.Dim("batch", min=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporter's notes on its own internals
        torch.onnx.export(
            model,
            inputs,
            str(path),
            dynamo=True,
            verbose=False,  # no progress lines on stdout
            opset_version=opset,
            input_names=list(input_names),
            output_names=["output"],
            dynamic_shapes=tuple({0: batch} for _ in inputs),
        )
    return path
