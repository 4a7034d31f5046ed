"""The red team stopped mid-swarm on the emulated internet, as a volunteer developer stops it: Ctrl-C,
then SIGTERM while it is still cleaning up. It says what it does, ends with one line and a non-zero
exit, and leaves no namespace or process behind (it once left both after a second signal)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from testbed.wan.netns import namespaces
from tests.helpers import needs_emulated_internet, processes_mentioning, wait_until

pytestmark = [
    pytest.mark.swarm,
    needs_emulated_internet,
]


# Slow (make test-all; about a minute): the default suite checks the signal handling itself
# (test_interrupts.py) and that a closed emulated internet leaves nothing (test_emulated_internet.py).
@pytest.mark.slow
def test_ctrl_c_then_sigterm_leaves_nothing_behind(tmp_path):
    out_dir = tmp_path / "red"
    before = set(namespaces())
    cmd = [sys.executable, "-m", "benchmarks.red_team", "--rounds", "2", "--attacks", "flops", "--no-plain",
           "--sites", "1", "--out", str(out_dir)]  # fmt: skip
    # started as nohup or a shell's background job starts it: SIGINT ignored
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))  # fmt: skip
    try:
        # the clean swarm is up: its namespaces exist and its peers are running
        wait_until(lambda: len(set(namespaces()) - before) >= 3, 120, "the emulated internet")
        wait_until(lambda: (out_dir / "clean" / "peer-5" / "log.txt").exists(), 120, "the last peer to start")
        time.sleep(3)
        proc.send_signal(signal.SIGINT)
        time.sleep(1)
        proc.send_signal(signal.SIGTERM)  # before the first stop has finished
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    assert proc.returncode == 1, stderr[-3000:]
    assert "stopping clean: its processes are stopped" in stdout, stdout
    assert (
        stderr.strip().splitlines()[-1] == "red_team: interrupted after 0 of 2 swarms; nothing left running"
    )
    assert "Traceback" not in stderr, stderr[-3000:]
    assert not set(namespaces()) - before, "the red team left namespaces behind"
    assert processes_mentioning(out_dir) == [], "the red team left processes behind"
