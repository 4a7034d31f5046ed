"""MANTA on a machine that has torch but not MANTA's other dependencies, from carried wheels.

Two commands, both run with the machine's own ``python3`` (standard library and ``packaging`` only):

- ``wheels DIR``: the wheels of DIR that this interpreter needs, one path a line on stdout (what
  ``pip install --target`` then installs); each decision on stderr. A wheel is skipped when the
  machine already has its package at a version that satisfies what MANTA and hivemind ask of it
  (:data:`NEEDS`; for the rest, at least the wheel's version): the machine's own copy stays in use.
  Exit 1 with one line when a needed wheel does not fit this interpreter or a package has two wheels.
- ``scripts BIN``: a console script in BIN for each of pyproject.toml's ``[project.scripts]``
  (``manta-peer``, ...), calling its function with this interpreter, as pip would write them.

    python3 scripts/device_env.py wheels .whl
    python3 scripts/device_env.py scripts /tmp/bin
"""

from __future__ import annotations

import sys
import tomllib
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from packaging.specifiers import SpecifierSet
from packaging.tags import sys_tags
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent

# What MANTA (pyproject.toml) and hivemind ask of packages the machine may have in another version.
NEEDS = {
    "protobuf": ">=5.29,<8",  # MANTA's range; hivemind's generated modules need a runtime >= 5.27.2
    "typing-extensions": ">=4.16.0",  # pydantic 2.14.3 and pydantic-core 2.50.4
    "click": ">=8.1,<9",
    "msgpack": ">=1.0",
}


@dataclass(frozen=True)
class Decision:
    wheel: Path
    name: str
    version: Version
    installed: str | None  # the machine's version, if it has the package
    install: bool
    why: str


def decide(wheel: Path, supported: frozenset[str]) -> Decision:
    """Whether ``wheel`` must be installed here; ValueError (one line) if it cannot be."""
    name, version, _, tags = parse_wheel_filename(wheel.name)
    try:
        installed: str | None = metadata.version(name)
    except metadata.PackageNotFoundError:
        installed = None
    need = SpecifierSet(NEEDS.get(name, f">={version}"))
    if installed is not None and Version(installed) in need:
        return Decision(wheel, name, version, installed, False, f"the machine's {installed} satisfies {need}")
    if not any(str(tag) in supported for tag in tags):
        raise ValueError(f"{wheel.name} does not fit this Python ({sys.version.split()[0]})")
    why = "not installed" if installed is None else f"the machine's {installed} does not satisfy {need}"
    return Decision(wheel, name, version, installed, True, why)


def needed_wheels(folder: Path) -> list[Decision]:
    """Every wheel of ``folder`` with its decision; ValueError if a package has two wheels."""
    wheels = sorted(folder.glob("*.whl"))
    if not wheels:
        raise ValueError(f"{folder} holds no wheels")
    names = [canonicalize_name(parse_wheel_filename(w.name)[0]) for w in wheels]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"{folder} holds two versions of {', '.join(twice)}: keep one")
    supported = frozenset(str(tag) for tag in sys_tags())
    return [decide(w, supported) for w in wheels]


def console_scripts(pyproject: Path) -> dict[str, str]:
    """``[project.scripts]``: script name -> ``module:function``."""
    return dict(tomllib.loads(pyproject.read_text())["project"]["scripts"])


def write_scripts(folder: Path, scripts: dict[str, str]) -> list[Path]:
    """One executable file per script in ``folder``, running this interpreter.

    The call sits under ``if __name__ == "__main__"``, as in pip's scripts: a worker started with
    ``spawn`` imports its parent's main module, and must not run the command again."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, target in scripts.items():
        module, _, function = target.partition(":")
        path = folder / name
        path.write_text(
            f"#!{sys.executable}\nimport sys\n\nfrom {module} import {function}\n\n"
            f'if __name__ == "__main__":\n    sys.exit({function}())\n'
        )
        path.chmod(0o755)
        written.append(path)
    return written


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("wheels", "scripts"):
        print("usage: device_env.py wheels DIR | scripts BIN", file=sys.stderr)
        return 2
    command, where = argv[0], Path(argv[1])
    try:
        if command == "wheels":
            for d in needed_wheels(where):
                print(
                    f"  {'install' if d.install else 'skip   '} {d.name} {d.version}: {d.why}",
                    file=sys.stderr,
                )
                if d.install:
                    print(d.wheel)
        else:
            for path in write_scripts(where, console_scripts(ROOT / "pyproject.toml")):
                print(f"  {path}", file=sys.stderr)
    except (ValueError, OSError, KeyError) as e:
        print(f"device_env.py: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
