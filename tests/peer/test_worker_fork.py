"""CPU workers forked from the agent before its first thread (peer/worker_fork.py): they compute what a
spawned worker computes, in far less private memory, and are never forked where a fork is unsafe."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

from peer.devices import WorkerDevice
from peer.worker_fork import WaitingWorkers, threads_in_this_process

ROOT = Path(__file__).resolve().parents[2]


def test_a_forked_worker_computes_what_a_spawned_one_does_in_less_private_memory_and_a_spare_leaves():
    done = subprocess.run(
        [sys.executable, "-m", "tests.peer.fork_or_spawn"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "leaked" not in done.stderr, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    forked, spawned = result["forked"], result["spawned"]
    assert forked["samples"] == spawned["samples"] == 16
    assert forked["digest"] == spawned["digest"]  # the same gradient, bit for bit
    # the forked worker shares the torch its agent imported (a spawned one holds ~290 MiB of its own)
    assert forked["private_mib"] < spawned["private_mib"] - 150, result
    assert result["spare"]["exitcode"] == 0, result  # never taken, it left when its pipe closed


def test_nothing_is_forked_beside_a_second_thread_or_for_a_gpu():
    gpu = WorkerDevice("cuda", 0, "a GPU", 1024)
    assert WaitingWorkers.fork_for([gpu]) is None  # a CUDA worker is spawned: no context inherited
    ready, leave = threading.Event(), threading.Event()
    thread = threading.Thread(target=lambda: (ready.set(), leave.wait(30)))
    thread.start()
    try:
        ready.wait(10)
        assert threads_in_this_process() >= 2
        assert WaitingWorkers.fork_for([WorkerDevice("cpu", 0, "cpu", 1024)]) is None
    finally:
        leave.set()
        thread.join(10)
