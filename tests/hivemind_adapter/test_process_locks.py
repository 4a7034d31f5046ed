"""Locks a killed process cannot leave held: hivemind's import-time semaphores, killed with their
holder, hung every later DHT call of the tree (a CI run lost an hour to it)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import torch

from hivemind_adapter.allreduce import VerifiedAverager
from hivemind_adapter.dht import start_dht
from hivemind_adapter.process_locks import DeathSafeLock

LOOPBACK = ["/ip4/127.0.0.1/tcp/0"]


def _child_holding(lock) -> int:
    """Fork a child that takes ``lock`` and waits to be killed; returns once it holds it."""
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: hold the lock until killed
        try:
            lock.acquire()
            os.write(ready_w, b"1")
            time.sleep(60)
        finally:
            os._exit(0)
    os.close(ready_w)
    assert os.read(ready_r, 1) == b"1"
    os.close(ready_r)
    return pid


def test_a_lock_held_by_another_process_excludes_until_that_process_is_killed():
    lock = DeathSafeLock()
    holder = _child_holding(lock)
    try:
        assert lock.acquire(timeout=0.3) is False  # another process holds it
        assert lock.acquire(block=False) is False
    finally:
        os.kill(holder, signal.SIGKILL)
        os.waitpid(holder, 0)
    assert lock.acquire(timeout=5.0) is True  # its holder's death released it
    lock.release()


def test_the_threads_of_one_process_take_it_in_turn():
    lock, inside, overlaps = DeathSafeLock(), [0], []

    def work():
        for _ in range(50):
            with lock:
                inside[0] += 1
                overlaps.append(inside[0] > 1)
                time.sleep(0.0005)
                inside[0] -= 1

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert len(overlaps) == 200 and not any(overlaps)


def test_a_child_forked_while_another_thread_held_it_takes_it_once_that_thread_lets_go():
    """The child's copy of the thread lock was held by a thread the child does not have."""
    lock, held, go = DeathSafeLock(), threading.Event(), threading.Event()

    def hold():
        with lock:
            held.set()
            go.wait(timeout=30)

    holder = threading.Thread(target=hold)
    holder.start()
    assert held.wait(timeout=10)
    done_r, done_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.write(done_w, b"1" if lock.acquire(timeout=20) else b"0")
        finally:
            os._exit(0)
    os.close(done_w)
    time.sleep(0.3)  # the child now waits on the parent's hold, across processes
    go.set()
    holder.join(timeout=10)
    try:
        assert os.read(done_r, 1) == b"1"
    finally:
        os.close(done_r)
        os.waitpid(pid, 0)


def test_a_dht_still_answers_and_starts_after_a_holder_of_hivemind_s_update_lock_was_killed():
    """Killed between its write of a result and the release (measured: 1 SIGKILL of 5 while a DHT
    answers calls), hivemind's semaphore stayed held and every later result of the tree waited for
    ever. Run in a fresh interpreter: without the fix, the hang would outlive the test."""
    code = textwrap.dedent(f"""
        import os, signal, time
        from hivemind_adapter.runtime import prepare_process
        prepare_process()
        from hivemind.utils.mpfuture import MPFuture
        from hivemind_adapter.dht import start_dht
        dht = start_dht(host_maddrs={LOOPBACK!r})
        pid = os.fork()
        if pid == 0:
            MPFuture._update_lock.acquire()  # as hivemind takes it to write a result, then killed
            os.kill(os.getpid(), signal.SIGKILL)
        os.waitpid(pid, 0)
        try:
            dht.get("anything", latest=True, return_future=True).result(timeout=10)
            second = start_dht(host_maddrs={LOOPBACK!r})  # its readiness is a result, too
            second.shutdown()
            print("answered")
        except TimeoutError:
            print("hung")
        finally:
            dht.shutdown()  # not killed: a killed DHT's daemon leaves its socket file
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "answered"


def test_an_averager_s_tensors_open_after_a_process_holding_their_lock_was_killed():
    dht = start_dht(host_maddrs=LOOPBACK)
    averager = VerifiedAverager([torch.zeros(4)], dht, prefix="killed-holder", start=True)
    try:
        holder = _child_holding(averager.lock_averaged_tensors)  # as the averager's process takes it
        os.kill(holder, signal.SIGKILL)
        os.waitpid(holder, 0)
        opened = threading.Event()

        def read():
            with averager.get_tensors() as tensors:
                assert tensors[0].shape == (4,)
                opened.set()

        threading.Thread(target=read, daemon=True).start()
        assert opened.wait(timeout=10), "the parent's get_tensors waited on a dead process's lock"
    finally:
        averager.shutdown()
        dht.shutdown()
