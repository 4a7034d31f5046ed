"""protocol/ stays free of torch and hivemind, so auditors can verify a ledger without the training stack."""

from __future__ import annotations

import pkgutil
import subprocess
import sys
import textwrap
from pathlib import Path

import protocol


def test_importing_every_protocol_module_loads_neither_torch_nor_hivemind():
    modules = sorted(f"protocol.{m.name}" for m in pkgutil.iter_modules(protocol.__path__))
    assert {
        "protocol.identity",
        "protocol.canonical",
        "protocol.records",
        "protocol.merkle",
        "protocol.note",
    } <= set(modules)
    code = textwrap.dedent(f"""
        import importlib, sys
        for name in {modules!r}:
            importlib.import_module(name)
        heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "hivemind"))
        print(",".join(heavy))
    """)
    root = Path(protocol.__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "", f"protocol imported: {done.stdout.strip()}"
