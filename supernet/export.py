"""Standalone (static) sub-networks: plain torch layers, and saving/loading them without MANTA.

``ClassificationSupernet.export(cfg)`` (and the elastic ops' ``export`` methods) build models from
the classes here, with the kernel-transformation matrices already applied to the copied weights and
with the batch-norm running statistics copied. The classes only use ``torch.nn`` layers, so a model
can be saved as a TorchScript archive (:func:`save_torchscript`) or a ``torch.export`` program
(:func:`save_exported_program`) and loaded by a process that has torch but not MANTA::

    model = torch.jit.load("subnet.pt")                   # TorchScript
    model = torch.export.load("subnet.pt2").module()      # torch.export
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


def save_exported_program(model: nn.Module, path: str | Path, example_input: torch.Tensor) -> Path:
    """``torch.export`` ``model`` in eval mode and save it; load with ``torch.export.load(path).module()``.

    The batch dimension is exported as dynamic (``torch.export`` specialises size 1, so the loaded
    program takes any batch size of at least 2; ``example_input`` must have at least 2 samples).
    """
    path = Path(path)
    model = model.eval()
    batch = torch.export.Dim("batch", min=2)
    program = torch.export.export(model, (example_input,), dynamic_shapes=({0: batch},))
    torch.export.save(program, str(path))
    return path
