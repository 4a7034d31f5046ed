"""A DHT in a process of its own outlives a caller that dies in the middle of a request (run in a
fresh interpreter: the caller is a forked child whose multiprocessing internals it replaces); its
start is bounded; a killed DHT's daemon socket file is removed, whether it ran in a thread or a
process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from hivemind_adapter.dht import DHTStartFailed, SwarmDHT, start_dht
from hivemind_adapter.process_identity import start_ticks

LOOPBACK = ["/ip4/127.0.0.1/tcp/0"]


def test_a_caller_that_dies_while_its_request_is_opened_leaves_the_dht_running():
    """The DHT's process fetches a request's reply pipe from the caller's process. Here the caller
    reads the fetch's question and dies before answering (what an averager killed just after it
    started did): hivemind's loop ended on that EOFError, and the peer's every later DHT call hung."""
    code = textwrap.dedent(f"""
        import json, multiprocessing, os, time
        from multiprocessing import resource_sharer
        from hivemind_adapter.runtime import prepare_process
        prepare_process()
        from hivemind_adapter.dht import read_entries, start_dht, store

        dht = start_dht(host_maddrs={LOOPBACK!r}, in_thread=False)  # the operator's: a process of its own
        store(dht, "before", 1, 60.0, subkey="a")

        def caller():
            def read_the_question_then_die(sharer):
                sharer._listener.accept().recv()
                os._exit(0)
            resource_sharer._ResourceSharer._serve = read_the_question_then_die
            dht.get("before", latest=True, return_future=True)  # carries this process's reply pipe
            time.sleep(30)

        child = multiprocessing.get_context("fork").Process(target=caller)
        child.start()
        child.join(20)
        time.sleep(0.5)
        alive = dht.is_alive()
        stored = store(dht, "after", 2, 60.0, subkey="b", timeout=10.0)
        read = read_entries(dht, "after", timeout=10.0)
        dht.shutdown()
        print(json.dumps(dict(caller_exit=child.exitcode, alive=alive, stored=stored, read=read)))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["caller_exit"] == 0, seen  # it died where it was meant to, not elsewhere
    assert "a DHT request was dropped: its sender is gone (EOFError" in done.stderr, done.stderr[-2000:]
    assert seen["alive"] and seen["stored"] and seen["read"] == {"b": 2}, seen


class _EndsWhileStarting(SwarmDHT):
    def run(self) -> None:
        os._exit(3)  # before it could report anything, as a process killed while it started


class _NeverReady(SwarmDHT):
    def run(self) -> None:
        time.sleep(600)


def test_a_dht_whose_process_ends_while_starting_fails_at_once_rather_than_waiting_for_ever():
    started = time.monotonic()
    with pytest.raises(DHTStartFailed, match=r"ended while starting \(exit code 3\)"):
        _EndsWhileStarting(host_maddrs=LOOPBACK, start=True)
    assert time.monotonic() - started < 30.0  # hivemind waited for its readiness with no bound


def test_a_dht_that_never_gets_ready_is_stopped_at_its_bound():
    dht = _NeverReady(host_maddrs=LOOPBACK, start=False)
    with pytest.raises(DHTStartFailed, match="did not get ready within 2 s"):
        dht.run_in_background(timeout=2.0)
    assert not dht.is_alive()


@pytest.mark.parametrize("in_thread", [True, False])
def test_a_killed_dht_s_daemon_socket_is_removed_by_its_shutdown(in_thread):
    """hivemind removes the daemon's socket file only in a shutdown it carries out."""
    dht = start_dht(host_maddrs=LOOPBACK, in_thread=in_thread)
    path = dht.daemon_socket
    assert path is not None and os.path.exists(path)
    dht.kill()
    dht.join(10)
    time.sleep(1.0)
    assert os.path.exists(path)  # the daemon ended, its file stayed
    dht.shutdown()
    assert not os.path.exists(path)
    assert dht.daemon_process is not None
    pid, started = dht.daemon_process
    running = start_ticks(pid) == started
    assert not running or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE  # no orphaned daemon
