"""The three files a standalone sub-network can be shipped as, chosen by the file's suffix.

======== ================= ================================================ ===========================
suffix   format            loaded by                                        needs
======== ================= ================================================ ===========================
``.pt2`` ``export``        ``torch.export.load(path).module()``             torch
``.onnx`` ``onnx``         ``onnxruntime.InferenceSession(path)``           onnx, onnxscript (export);
                                                                            onnxruntime (running it)
other    ``torchscript``   ``torch.jit.load(path)``                         torch
======== ================= ================================================ ===========================

:func:`save_model` writes one, :func:`load_model` reads it back with the format's own tool as a
torch module (ONNX runs in onnxruntime behind a thin wrapper), so the same evaluation code runs it.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
from torch import nn

from supernet.export import save_exported_program, save_onnx, save_torchscript
from supernet.export_choice import FORMATS, format_of, load_command, missing_packages

__all__ = ["FORMATS", "format_of", "load_command", "load_model", "missing_packages", "save_model"]


def save_model(
    model: nn.Module, path: str | Path, fmt: str, inputs: tuple[torch.Tensor, ...], input_names: list[str]
) -> Path:
    """Write ``model`` (eval mode) at ``path`` as ``fmt``; ``inputs`` is an example batch (the batch
    dimension is exported as dynamic), ``input_names`` names them (ONNX)."""
    if fmt == "torchscript":
        return save_torchscript(model, path)
    if fmt == "export":
        return save_exported_program(model, path, inputs)
    if fmt == "onnx":
        return save_onnx(model, path, inputs, input_names)
    raise ValueError(f"unknown export format {fmt!r} (choose from {', '.join(FORMATS)})")


class _Callable(nn.Module):
    """A loaded model behind ``nn.Module``'s interface (``eval()``, ``training``) for the evaluation
    code; the model itself is kept out of the module tree (an exported program refuses ``eval()``)."""

    def __init__(self, run) -> None:
        super().__init__()
        self._run = [run]

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return self._run[0](*inputs)


def _onnx_runner(path: Path):
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()
    options.inter_op_num_threads = 1
    session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]

    def run(*inputs: torch.Tensor) -> torch.Tensor:
        feeds = {name: t.detach().cpu().contiguous().numpy() for name, t in zip(names, inputs)}
        return torch.from_numpy(session.run(None, feeds)[0])

    return run


def load_model(path: str | Path, fmt: str) -> nn.Module:
    """``path`` loaded by its format's own tool (``torch.jit.load``, ``torch.export.load(...).module()``,
    an ``onnxruntime.InferenceSession``), on the CPU, callable like the model that was saved."""
    path = Path(path)
    if fmt == "torchscript":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # torch.jit is deprecated upstream, still works
            return torch.jit.load(str(path), map_location="cpu")
    if fmt == "export":
        return _Callable(torch.export.load(str(path)).module())
    if fmt == "onnx":
        return _Callable(_onnx_runner(path))
    raise ValueError(f"unknown export format {fmt!r} (choose from {', '.join(FORMATS)})")
