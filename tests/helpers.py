"""Small helpers shared by tests."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path


def console_script(name: str) -> str:
    """Path of an installed MANTA console script: beside this interpreter (the project's .venv), else on PATH."""
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return str(beside)
    found = shutil.which(name)
    if not found:
        raise FileNotFoundError(f"{name} is not installed (run `make venv`)")
    return found
