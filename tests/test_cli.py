"""The installed console scripts answer --help and --version (run as real subprocesses)."""

from __future__ import annotations

import subprocess

import pytest

from protocol import __version__
from tests.helpers import console_script

SCRIPTS = ["manta-peer", "manta-aggregator", "manta-ledger", "manta-swarm"]


@pytest.mark.parametrize("script", SCRIPTS)
def test_console_script_help_and_version(script):
    exe = console_script(script)
    helped = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=60)
    assert helped.returncode == 0, helped.stderr
    assert f"Usage: {script}" in helped.stdout
    versioned = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=60)
    assert versioned.returncode == 0, versioned.stderr
    assert versioned.stdout.strip() == f"{script}, version {__version__}"


@pytest.mark.parametrize("script", SCRIPTS)
def test_unknown_subcommand_is_a_one_line_usage_error(script):
    done = subprocess.run(
        [console_script(script), "no-such-command"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert "No such command" in done.stderr
