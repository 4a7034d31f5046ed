import logging
import os
import subprocess
import sys

from console.logs import resolve_level


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
