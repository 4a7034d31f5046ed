import datetime
import json
import logging
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from console.logs import resolve_level
from tests.helpers import console_script, wait_until


def test_resolve_level_accepts_names_numbers_and_falls_back_to_info():
    assert resolve_level("debug") == logging.DEBUG
    assert resolve_level(" WARNING ") == logging.WARNING
    assert resolve_level("15") == 15
    assert resolve_level("nonsense") == logging.INFO
    assert resolve_level(None) == logging.INFO


def test_manta_log_level_governs_a_fresh_process():
    code = (
        "import logging; from console.logs import setup_logging; setup_logging(); setup_logging();"
        "log = logging.getLogger('manta.test'); log.debug('dbg-line'); log.info('info-line'); log.warning('warn-line')"
    )
    env = dict(os.environ, MANTA_LOG_LEVEL="WARNING")
    quiet = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert "warn-line" in quiet.stderr and "info-line" not in quiet.stderr
    assert quiet.stderr.count("warn-line") == 1, "setup_logging twice must not duplicate lines"
    env["MANTA_LOG_LEVEL"] = "DEBUG"
    loud = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert "dbg-line" in loud.stderr and "info-line" in loud.stderr


ROOT = Path(__file__).resolve().parents[2]
TEXT_LINE = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2} (DEBUG|INFO|WARNING|ERROR) +manta\.\w+: ")


def _probe(*args: str, **env: str) -> subprocess.CompletedProcess:
    """tests/console/log_probe.py as a real process (its command logs, and so does its child)."""
    environ = {k: v for k, v in os.environ.items() if k not in ("MANTA_LOG_LEVEL", "MANTA_LOG_FORMAT")}
    done = subprocess.run(
        [sys.executable, "-m", "tests.console.log_probe", *args],
        capture_output=True, text=True, timeout=120, cwd=ROOT, env={**environ, **env},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done


def _messages(stderr: str) -> list[str]:
    return [line.split(": ", 1)[1] for line in stderr.splitlines() if TEXT_LINE.match(line)]


def test_text_lines_carry_the_date_and_the_options_set_the_level_for_the_process_and_its_children():
    default = _probe("speak")
    assert _messages(default.stderr) == ["info-line", "warning-line", "error-line", "child-info-line"]
    assert "RuntimeError: boom" in default.stderr  # the exception's traceback follows its line
    for args in (["-q", "speak"], ["speak", "-q"], ["speak", "--quiet"]):
        assert _messages(_probe(*args).stderr) == ["warning-line", "error-line"], args
    assert _messages(_probe("-qq", "speak").stderr) == ["error-line"]
    loud = ["debug-line", "info-line", "warning-line", "error-line", "child-debug-line", "child-info-line"]
    for args in (["-v", "speak"], ["speak", "-v"]):
        assert _messages(_probe(*args).stderr) == loud, args
    # The options win over MANTA_LOG_LEVEL; without them, it stays in force.
    assert _messages(_probe("speak", "-q", MANTA_LOG_LEVEL="DEBUG").stderr) == ["warning-line", "error-line"]
    assert _messages(_probe("speak", MANTA_LOG_LEVEL="ERROR").stderr) == ["error-line"]


def test_json_lines_are_one_object_per_record_in_the_process_and_its_children():
    for args, env in (
        (["--log-format", "json", "speak"], {}),
        (["speak", "--log-format", "json"], {"MANTA_LOG_FORMAT": "text"}),  # the option wins
        (["speak"], {"MANTA_LOG_FORMAT": "json"}),
    ):
        done = _probe(*args, **env)
        records = [json.loads(line) for line in done.stderr.splitlines()]  # every line is one object
        assert [r["message"] for r in records] == [
            "info-line",
            "warning-line",
            "error-line",
            "child-info-line",
        ]
        for r in records:
            assert set(r) >= {"time", "level", "logger", "message"}, r
            assert datetime.datetime.fromisoformat(r["time"]).tzinfo is not None, r["time"]
        assert [r["level"] for r in records] == ["INFO", "WARNING", "ERROR", "INFO"]
        assert [r["logger"] for r in records] == ["manta.probe"] * 3 + ["manta.child"]
        assert "RuntimeError: boom" in records[2]["exception"] and "exception" not in records[0]
    verbose = _probe("-v", "--log-format", "json", "speak")
    levels = [json.loads(line)["level"] for line in verbose.stderr.splitlines()]
    assert levels == ["DEBUG", "INFO", "WARNING", "ERROR", "DEBUG", "INFO"]


def test_an_unknown_log_format_is_a_one_line_usage_error():
    done = subprocess.run(
        [sys.executable, "-m", "tests.console.log_probe", "--log-format", "xml", "speak"],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 2
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and "Invalid value for '--log-format'" in lines[0], done.stderr


def _aggregator(tmp_path: Path, name: str, *log_args: str) -> tuple[str, str]:
    """A real `manta-aggregator start` of a built-in task, stopped once it printed its join line:
    (stdout, stderr). Its DHT and other processes are its children."""
    out, err = tmp_path / f"{name}.out", tmp_path / f"{name}.err"
    with open(out, "w") as o, open(err, "w") as e:
        proc = subprocess.Popen(
            [console_script("manta-aggregator"), *log_args, "start", "--task", "digits", "--listen",
             "127.0.0.1:0", "--http", "off", "--identity", str(tmp_path / "agg.key"), "--data-dir",
             str(tmp_path / name)],
            stdout=o, stderr=e, cwd=tmp_path, env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip
    try:
        wait_until(
            lambda: "manta-peer join" in out.read_text() or proc.poll() is not None, 120, "the join line"
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, err.read_text()[-2000:]
    return out.read_text(), err.read_text()


# Slow (20 s, `make test-all`): the default suite checks the formats and levels in a fresh process and
# its children (above).
@pytest.mark.slow
@pytest.mark.swarm  # a real aggregator: its DHT process and p2p daemon
def test_a_real_aggregator_logs_json_lines_with_v_and_fewer_lines_with_q(tmp_path):
    out, err = _aggregator(tmp_path, "json", "-v", "--log-format", "json")
    assert "manta-peer join" in out
    records = [json.loads(line) for line in err.splitlines()]  # hivemind's lines too
    serving = [
        r for r in records if r["message"].startswith("aggregator ") and "serving task" in r["message"]
    ]
    assert len(serving) == 1 and serving[0]["level"] == "INFO" and serving[0]["logger"] == "manta.aggregator"
    assert any(r["level"] == "DEBUG" for r in records), "-v shows debugging detail"
    out, err = _aggregator(tmp_path, "quiet", "-q")
    assert "manta-peer join" in out  # what the operator needs is on stdout, not in the log
    assert "serving task" not in err and "INFO" not in err, err
