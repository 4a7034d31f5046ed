"""A process's start as the kernel keeps it: the same at every read, another for another process, and
None once the process is gone; a process runs until it ended, collected or not."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil

from hivemind_adapter.process_identity import is_running, start_ticks


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


def test_a_process_runs_until_it_ended_even_while_its_parent_has_not_collected_it():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        started = start_ticks(child.pid)
        assert is_running(child.pid, started)
        assert not is_running(child.pid, started + 1)  # the same pid, another start: another process
        child.kill()  # not collected yet: the ended child stays a zombie until child.wait()
        deadline = time.monotonic() + 10
        while psutil.Process(child.pid).status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
            time.sleep(0.01)
        assert psutil.Process(child.pid).status() == psutil.STATUS_ZOMBIE
        assert not is_running(child.pid, started)
    finally:
        child.kill()
        child.wait(10)
    assert not is_running(child.pid, started)
