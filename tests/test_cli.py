"""The installed console scripts answer --help and --version (run as real subprocesses)."""

from __future__ import annotations

import subprocess
import sys

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


def test_the_aggregator_command_line_is_built_without_loading_torch():
    # Its `search` sub-command takes manta-search's options; they must not drag torch (seconds) into
    # `manta-aggregator --help` or a usage error.
    probe = "import sys, aggregator.cli, peer.cli, ledger.cli; print(sorted({'torch', 'hivemind'} & set(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


GROUPS = ["manta-peer", "manta-aggregator", "manta-ledger"]  # manta-swarm is a single command


@pytest.mark.parametrize("script", GROUPS)
def test_unknown_subcommand_is_a_one_line_usage_error(script):
    done = subprocess.run(
        [console_script(script), "no-such-command"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert done.stderr.splitlines() == [f"Error: No such command 'no-such-command'. (see '{script} --help')"]


@pytest.mark.parametrize(
    "command, args, message",
    [
        ("manta-peer join", ["--bogus"], "No such option '--bogus'"),
        ("manta-ledger verify", [], "Missing argument 'PATH'"),
        ("manta-aggregator start", ["--checkpoint-every", "often"], "Invalid value for '--checkpoint-every'"),
        ("manta-swarm", ["--peers", "x"], "Invalid value for '--peers'"),
        ("manta-search", [], "Missing option '--checkpoint'"),
    ],
)
def test_usage_errors_are_one_line_with_a_pointer_to_help(command, args, message):
    script, *subcommand = command.split()
    done = subprocess.run(
        [console_script(script), *subcommand, *args], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and message in lines[0], done.stderr
    assert lines[0].endswith(f"(see '{command} --help')"), lines[0]


def test_manta_swarm_rejects_bad_options_in_one_line(tmp_path):
    for args, message in (
        (["--peers", "0"], "--peers"),
        (["--peers", "2", "--cohorts", "3"], "more than --peers"),
        (["--peers", "2", "--task", "nope"], "unknown task"),
        (["--peers", "2", "--lr", "fast"], "--lr must be a positive number"),
    ):
        done = subprocess.run(
            [console_script("manta-swarm"), *args, "--data-dir", str(tmp_path / "run")],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode != 0, args
        assert "Traceback" not in done.stderr and message in done.stderr, (args, done.stderr)
        errors = [line for line in done.stderr.splitlines() if line.startswith("Error:")]
        assert len(errors) == 1, done.stderr
    assert not (tmp_path / "run").exists(), "a rejected command must not start anything"
