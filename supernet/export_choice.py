"""Which file format an exported sub-network is written in, chosen by its suffix, and what each
needs: no torch, so a command checks ``--export`` before loading it (the table is in
:mod:`supernet.export_formats`)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

FORMATS = ("torchscript", "export", "onnx")
_SUFFIXES = {".pt2": "export", ".onnx": "onnx"}
_NEEDS = {"onnx": ("onnx", "onnxscript", "onnxruntime")}


def format_of(path: str | Path) -> str:
    """``export`` for ``.pt2``, ``onnx`` for ``.onnx``, ``torchscript`` for any other suffix."""
    return _SUFFIXES.get(Path(path).suffix.lower(), "torchscript")


def missing_packages(fmt: str) -> list[str]:
    """The packages that writing and checking ``fmt`` needs and this interpreter cannot import."""
    return [name for name in _NEEDS.get(fmt, ()) if importlib.util.find_spec(name) is None]


def load_command(fmt: str, name: str) -> str:
    """How a user loads file ``name`` of format ``fmt`` (for the JSON written beside it)."""
    return {
        "torchscript": f"torch.jit.load({name!r})",
        "export": f"torch.export.load({name!r}).module()",
        "onnx": f"onnxruntime.InferenceSession({name!r})",
    }[fmt]
