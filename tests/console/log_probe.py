"""A console script built with MANTA's shared group (console.commands.manta_group) whose one command
logs at every level, logs an exception, and starts a child process that sets up logging as MANTA's
worker processes do. tests/console/test_logs.py runs it as a real process:

    python -m tests.console.log_probe [GROUP OPTIONS] speak [OPTIONS]
"""

from __future__ import annotations

import logging
import subprocess
import sys

from console.commands import manta_group

CHILD = (
    "import logging; from console.logs import setup_logging; setup_logging(); "
    "log = logging.getLogger('manta.child'); log.debug('child-debug-line'); log.info('child-info-line')"
)


@manta_group("log-probe", "Logs at every level (a test's probe).")
def main() -> None:
    pass


@main.command()
def speak() -> None:
    """Log one line at each level and an exception, then run a child process that logs."""
    log = logging.getLogger("manta.probe")
    log.debug("debug-line")
    log.info("info-line")
    log.warning("warning-line")
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        log.exception("error-line")
    subprocess.run([sys.executable, "-c", CHILD], check=True)


if __name__ == "__main__":
    main()
