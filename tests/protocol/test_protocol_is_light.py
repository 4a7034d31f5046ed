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


def test_no_protocol_module_imports_torch_or_hivemind_even_lazily():
    # An import inside a function passes the test above until someone calls it; the rule is the package's.
    import ast

    offenders = []
    for path in sorted(Path(protocol.__file__).resolve().parent.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            offenders += [
                f"{path.name}:{node.lineno} {n}" for n in names if n.split(".")[0] in ("torch", "hivemind")
            ]
    assert offenders == []
