"""hivemind's DHT and averagers served from threads of the process that made them: no process of
their own, requests answered through the futures they carry, a killed component refusing at once."""

from __future__ import annotations

import asyncio
import threading
import time

import psutil
import pytest
import torch
from hivemind.utils import MPFuture

from hivemind_adapter.allreduce import VerifiedAverager
from hivemind_adapter.dht import read_entries, start_dht, store
from hivemind_adapter.in_thread import ComponentEnded, install_thread_safe_future_events

LOOPBACK = ["/ip4/127.0.0.1/tcp/0"]


def _children() -> set[tuple[int, str]]:
    return {(p.pid, p.name()) for p in psutil.Process().children(recursive=True)}


def test_two_peers_of_a_dht_and_an_averager_each_add_one_process_their_daemon_and_average():
    before = _children()
    dhts = [start_dht(host_maddrs=LOOPBACK)]
    dhts.append(start_dht(host_maddrs=LOOPBACK, initial_peers=[str(m) for m in dhts[0].get_visible_maddrs()]))
    averagers = []
    try:
        for dht, value in zip(dhts, (1.0, 3.0)):
            averagers.append(
                VerifiedAverager(
                    [torch.full((6,), value)], dht, prefix="hosted", target_group_size=2, start=True
                )
            )
        assert sorted(name for _, name in _children() - before) == ["p2pd", "p2pd"]
        steps = [averager.step(wait=False) for averager in averagers]
        for step in steps:
            step.result(timeout=60)
        for averager in averagers:
            with averager.get_tensors() as tensors:
                assert torch.equal(tensors[0], torch.full((6,), 2.0))
    finally:
        for averager in averagers:
            averager.shutdown()
        for dht in dhts:
            dht.shutdown()
    assert all(not a.is_alive() and a.exitcode == 0 for a in averagers)
    assert all(not d.is_alive() and d.exitcode == 0 for d in dhts)
    assert not _children() - before  # each daemon went with its DHT


def test_a_future_made_beside_an_idle_loop_is_resolved_from_a_thread_running_another():
    """hivemind would run the maker's idle loop from the resolving thread, which already runs its own:
    the waiter was never woken and every DHT call waited out its bound."""
    install_thread_safe_future_events()
    asyncio.set_event_loop(asyncio.new_event_loop())  # the maker's loop, idle (as in a peer's main thread)
    future = MPFuture()
    loop = asyncio.new_event_loop()

    async def resolve():
        future.set_result("answered")

    thread = threading.Thread(target=loop.run_until_complete, args=(resolve(),))
    thread.start()
    thread.join(10)
    loop.close()
    assert future.result(timeout=2.0) == "answered"


def test_requests_to_a_killed_dht_are_refused_at_once_and_its_daemon_goes_with_it():
    dht = start_dht(host_maddrs=LOOPBACK)
    pid, _started = dht.daemon_process
    assert store(dht, "k", 1, 60.0, subkey="s") and read_entries(dht, "k") == {"s": 1}
    dht.kill()
    dht.join(10)
    assert not dht.is_alive() and dht.exitcode == 1
    began = time.monotonic()
    with pytest.raises(ComponentEnded):
        dht.get("k", return_future=True)
    assert time.monotonic() - began < 1.0
    assert store(dht, "k", 2, 60.0, subkey="s", timeout=3600.0) is False  # MANTA's reads: nothing, at once
    dht.shutdown()  # removes the daemon's socket file
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_a_dht_whose_daemon_was_killed_ends_with_it():
    dht = start_dht(host_maddrs=LOOPBACK)
    try:
        pid, _started = dht.daemon_process
        psutil.Process(pid).kill()
        deadline = time.monotonic() + 10
        while dht.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not dht.is_alive() and dht.exitcode == 1
    finally:
        dht.shutdown()


def test_a_store_sent_without_waiting_just_before_shutdown_still_lands():
    """A peer posts its last report of a round without waiting, and may leave right after: the
    shutdown lets the store land first (it was cancelled with the node, and the report lost)."""
    boot = start_dht(host_maddrs=LOOPBACK)
    try:
        peers = [str(m) for m in boot.get_visible_maddrs()]
        for n in range(3):
            leaving = start_dht(host_maddrs=LOOPBACK, initial_peers=peers)
            assert store(leaving, "last-words", n, 60.0, subkey=f"report-{n}", wait=False)
            leaving.shutdown()
            assert not leaving.is_alive() and leaving.exitcode == 0
        assert read_entries(boot, "last-words") == {f"report-{n}": n for n in range(3)}
    finally:
        boot.shutdown()


async def _sleep_long(_dht, _node) -> None:
    await asyncio.sleep(60)


def test_a_request_in_flight_when_the_dht_is_killed_fails_as_ended_not_cancelled():
    """Its caller (the announcer's thread, a store's waiter) handles an ended DHT; asyncio's
    CancelledError, from the request's cancelled task, escaped every handler and printed a traceback."""
    dht = start_dht(host_maddrs=LOOPBACK)
    try:
        pending = dht.run_coroutine(_sleep_long, return_future=True)
        time.sleep(0.5)
        assert not pending.done()
        dht.kill()
        dht.join(10)
        assert isinstance(pending.exception(timeout=5), ComponentEnded)
    finally:
        dht.shutdown()
