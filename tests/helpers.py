"""Small helpers shared by tests."""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Callable
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


def wait_until(predicate: Callable[[], object], timeout: float, what: str, poll: float = 0.5) -> None:
    """Poll ``predicate`` until it is true; an AssertionError naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(poll)
