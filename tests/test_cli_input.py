"""Every command checks its input before it creates a file or loads torch: ``--help`` of every
command and sub-command loads neither torch nor hivemind, an unknown option is one line (exit 2) and
bad values one line (exit 1), and none of them leaves a file behind (not even an identity key).

Each case is a real process running the console script's command as installed (pyproject's
``[project.scripts]``), in an empty folder with ``HOME`` pointing into it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import click
import pytest

from tests.helpers import console_script

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
GOOD_PEER = "/ip4/127.0.0.1/tcp/31337/p2p/QmSBUfPjhdbT5M2uQ6xHzpfukzPy4zLikVL22vxNhiqVzx"


def _command_paths() -> list[tuple[str, ...]]:
    """(script, sub-command...) of every command and sub-command (imports only click commands)."""
    import importlib

    paths = []
    for script, target in SCRIPTS.items():
        module, _, attribute = target.partition(":")
        command = getattr(importlib.import_module(module), attribute)
        paths.append((script,))
        if isinstance(command, click.Group):
            paths += [(script, name) for name in command.list_commands(click.Context(command))]
    return paths


COMMANDS = _command_paths()


def _run_in(folder: Path, script: str, args: list[str]) -> tuple[int, list[str], list[str]]:
    """Run ``script``'s command with ``args`` in a fresh interpreter in ``folder`` (HOME there too):
    (exit status, stderr lines, which of torch and hivemind it loaded)."""
    module, _, attribute = SCRIPTS[script].partition(":")
    code = (
        "import contextlib, io, sys\n"
        f"from {module} import {attribute} as main\n"
        "status, shown = 0, io.StringIO()\n"
        "try:\n"
        "    with contextlib.redirect_stdout(shown):\n"
        f"        main({args!r}, prog_name={script!r})\n"
        "except SystemExit as e:\n"
        "    status = e.code or 0\n"
        "print(','.join(m for m in ('torch', 'hivemind') if m in sys.modules))\n"
        "sys.exit(status)\n"
    )
    env = {**os.environ, "HOME": str(folder / "home"), "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=folder, env=env
    )
    loaded = (
        [m for m in done.stdout.strip().splitlines()[-1:][0].split(",") if m] if done.stdout.strip() else []
    )
    return done.returncode, done.stderr.splitlines(), loaded


def _files_in(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.mark.parametrize("path", COMMANDS, ids=" ".join)
def test_help_loads_neither_torch_nor_hivemind(tmp_path, path):
    (tmp_path / "home").mkdir()
    status, errors, loaded = _run_in(tmp_path, path[0], [*path[1:], "--help"])
    assert status == 0 and not errors, errors
    assert loaded == [], f"{' '.join(path)} --help loaded {loaded}"
    assert _files_in(tmp_path) == ["home"]


@pytest.mark.parametrize("path", COMMANDS, ids=" ".join)
def test_an_unknown_option_is_one_line_and_leaves_no_file(tmp_path, path):
    (tmp_path / "home").mkdir()
    done = subprocess.run(
        [console_script(path[0]), *path[1:], "--no-such-option"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, env={**os.environ, "HOME": str(tmp_path / "home")},
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and "No such option '--no-such-option'" in lines[0], done.stderr
    assert _files_in(tmp_path) == ["home"]


BAD_VALUES = [
    ("manta-aggregator", ["start"], "--task is required"),
    ("manta-aggregator", ["start", "--task", "nope"], "unknown task 'nope'"),
    ("manta-aggregator", ["start", "--task", "missing.toml"], "task file missing.toml does not exist"),
    ("manta-aggregator", ["start", "--task", "digits", "--listen", "nowhere"], "--listen must be HOST:PORT"),
    ("manta-aggregator", ["start", "--task", "digits", "--http", "nowhere"], "--http must be HOST:PORT"),
    (
        "manta-aggregator",
        ["start", "--task", "digits", "--initial-peers", "x"],
        "initial peer must look like",
    ),
    (
        "manta-aggregator",
        ["search", "--data-dir", "nodir", "--max-mflops", "1"],
        "not an aggregator data directory",
    ),
    ("manta-peer", ["join", "--initial-peers", "nowhere"], "initial peer must look like"),
    (
        "manta-peer",
        ["join", "--initial-peers", GOOD_PEER, "--aggregator-key", "zz"],
        "--aggregator-key must be",
    ),
    ("manta-peer", ["join", "--initial-peers", GOOD_PEER, "--cache-size", "lots"], "--cache-size"),
    ("manta-peer", ["credits"], "no --initial-peers and no manta-peer/swarm.json"),
    ("manta-peer", ["credits", "--initial-peers", "nowhere"], "initial peer must look like"),
    ("manta-peer", ["check"], "no --initial-peers and no manta-peer/swarm.json"),
    ("manta-peer", ["check", "--initial-peers", "nowhere"], "initial peer must look like"),
    (
        "manta-peer",
        ["check", "--initial-peers", GOOD_PEER, "--listen", "nowhere"],
        "--listen must be HOST:PORT",
    ),
    (
        "manta-peer",
        ["check", "--initial-peers", GOOD_PEER, "--announce", "1.2.3.4:0"],
        "--announce needs an explicit port",
    ),
    ("manta-ledger", ["verify", "missing.sqlite"], "no ledger at missing.sqlite"),
    ("manta-ledger", ["rewards", "missing.sqlite"], "no ledger at missing.sqlite"),
    ("manta-swarm", ["--peers", "2", "--task", "nope"], "unknown task 'nope'"),
    ("manta-search", ["--checkpoint", "missing.pt"], "give exactly one budget"),
    (
        "manta-search",
        ["--checkpoint", "missing.pt", "--max-mflops", "1"],
        "checkpoint missing.pt does not exist",
    ),
]


@pytest.mark.parametrize(
    "script, args, message", BAD_VALUES, ids=[" ".join([s, *a]) for s, a, _ in BAD_VALUES]
)
def test_bad_values_are_one_line_before_torch_and_leave_no_file(tmp_path, script, args, message):
    (tmp_path / "home").mkdir()
    status, errors, loaded = _run_in(tmp_path, script, args)
    assert status == 1 and len(errors) == 1 and errors[0].startswith("Error: ") and message in errors[0], (
        errors
    )
    assert loaded == [], f"{script} {' '.join(args)} loaded {loaded} before refusing"
    assert _files_in(tmp_path) == ["home"], "a refused command must create no file (nor an identity key)"
