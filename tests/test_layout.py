"""The package rules of the layout (README, "Layout"), checked on every import statement of every
module, including those inside functions: a lazy import breaks a rule as surely as one at the top,
only later.

Each package may import only what its row allows, so what a package depends on can be read off this
table, and a change that crosses a line fails here with the file and line that crossed it.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = (
    "protocol",
    "ledger",
    "console",
    "robust_aggregation",
    "hivemind_adapter",
    "supernet",
    "tasks",
    "peer",
    "aggregator",
    "testbed",
)
HEAVY = ("torch", "torchvision", "hivemind", "numpy")

# package -> (MANTA packages it may import, third-party packages it must not import)
RULES: dict[str, tuple[set[str], set[str]]] = {
    # Records, identities, canonical encoding, Merkle math, signed notes, DHT schema: pure Python.
    "protocol": ({"protocol"}, set(HEAVY)),
    # The Merkle log, its verification, rewards and manta-ledger: pure, for auditors without torch.
    "ledger": ({"ledger", "protocol", "console"}, set(HEAVY)),
    # Click conventions and logging shared by every entry point.
    "console": ({"console", "protocol"}, set(HEAVY)),
    # Robust aggregation math (CenteredClip, reducer proofs, alignment, reply checks): torch only.
    "robust_aggregation": ({"robust_aggregation", "protocol"}, {"hivemind"}),
    # The one place that knows hivemind's internals.
    "hivemind_adapter": ({"hivemind_adapter", "robust_aggregation", "protocol", "supernet"}, set()),
    # Models, search, datasets: no networking.
    "supernet": ({"supernet", "tasks", "protocol", "console"}, {"hivemind"}),
    "tasks": ({"tasks", "supernet", "protocol"}, {"hivemind"}),
    # The volunteer client and the operator never import each other, nor the developer tooling.
    "peer": (
        {
            "peer",
            "protocol",
            "ledger",
            "console",
            "robust_aggregation",
            "hivemind_adapter",
            "supernet",
            "tasks",
        },
        {"hivemind"},
    ),
    "aggregator": (
        {
            "aggregator",
            "protocol",
            "ledger",
            "console",
            "robust_aggregation",
            "hivemind_adapter",
            "supernet",
            "tasks",
        },
        {"hivemind"},
    ),
    # Developer tooling runs the others as processes; it may read their files and records.
    "testbed": (
        {
            "testbed",
            "protocol",
            "ledger",
            "console",
            "robust_aggregation",
            "hivemind_adapter",
            "supernet",
            "tasks",
        },
        {"hivemind"},
    ),
}


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in ``path``."""
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                found.append((node.lineno, ".".join([*base, node.module] if node.module else base)))
            elif node.module:
                found.append((node.lineno, node.module))
    return found


def _violations(package: str) -> list[str]:
    allowed, banned = RULES[package]
    out = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for line, module in _imports(path):
            top = module.split(".")[0]
            where = f"{path.relative_to(ROOT)}:{line} imports {module}"
            if top in PACKAGES and top not in allowed:
                out.append(where)
            elif top in ("tests", "benchmarks"):  # not installed: the wheel holds only PACKAGES
                out.append(where)
            elif top in banned:
                out.append(where)
    return out


def test_every_package_has_a_rule():
    on_disk = {p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file() and p.name not in ("tests",)}
    assert on_disk - {"benchmarks"} == set(PACKAGES)


@pytest.mark.parametrize("package", PACKAGES)
def test_package_imports_only_what_its_rule_allows(package):
    assert _violations(package) == []


def test_the_checker_sees_a_violation_inside_a_function(tmp_path, monkeypatch):
    # The rule is only as good as the parser: an import hidden in a function body must be found.
    fake = tmp_path / "peer"
    fake.mkdir()
    (fake / "__init__.py").write_text("")
    (fake / "sneaky.py").write_text(
        "def f():\n    from aggregator.bootstrap import X\n    import hivemind\n    from tests.helpers import Y\n"
    )
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert _violations("peer") == [
        "peer/sneaky.py:2 imports aggregator.bootstrap",
        "peer/sneaky.py:3 imports hivemind",
        "peer/sneaky.py:4 imports tests.helpers",
    ]
