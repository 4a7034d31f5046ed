"""A process's start as the kernel keeps it: the same at every read, another for another process, and
None once the process is gone."""

from __future__ import annotations

import os
import subprocess
import sys

import psutil

from hivemind_adapter.process_identity import start_ticks


def test_a_start_is_stable_distinct_and_gone_with_its_process():
    first = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        started = start_ticks(first.pid)
        assert started is not None and start_ticks(first.pid) == started
        # psutil's creation time, less its boot time, is the same count of ticks since boot
        since_boot = psutil.Process(first.pid).create_time() - psutil.boot_time()
        assert abs(started / os.sysconf("SC_CLK_TCK") - since_boot) < 0.02
        assert start_ticks(os.getpid()) is not None and start_ticks(os.getpid()) <= started
    finally:
        first.kill()
        first.wait(10)
    assert start_ticks(first.pid) is None
