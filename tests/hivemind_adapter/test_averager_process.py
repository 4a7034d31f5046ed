"""An averager's start is bounded and fails at once when it cannot succeed (its DHT ended, its own
start failed)."""

from __future__ import annotations

import signal
import time

import pytest
import torch

from hivemind_adapter.allreduce import VerifiedAverager
from hivemind_adapter.averager_process import AveragerGone, AveragerStartFailed
from hivemind_adapter.dht import read_entries, start_dht, store
from hivemind_adapter.p2p_sockets import daemon_socket_files, remove_dead_daemon_sockets

LOOPBACK = ["/ip4/127.0.0.1/tcp/0"]


def test_an_averager_on_a_dead_dht_fails_to_start_within_its_bound_and_gives_sigint_back():
    daemons = daemon_socket_files()
    dht = start_dht(host_maddrs=LOOPBACK)
    dht.kill()  # the DHT gone, as when something killed it under a running peer
    dht.join(10)
    assert not dht.is_alive()
    # MANTA's bounded calls answer "nothing" at once rather than wait out their bound (an hour here)
    assert store(dht, "gone", 1, 60.0, subkey="s", timeout=3600.0) is False
    assert read_entries(dht, "gone", timeout=3600.0) == {}

    def handler(signum, frame):
        pass

    before = signal.signal(signal.SIGINT, handler)
    try:
        # hivemind's own __init__ asked the dead DHT's process a question and waited forever
        with pytest.raises(AveragerStartFailed, match="its DHT has ended"):
            VerifiedAverager([torch.zeros(4)], dht, prefix="dead-dht", start=True)
        assert signal.getsignal(signal.SIGINT) is handler
    finally:
        signal.signal(signal.SIGINT, before)
        remove_dead_daemon_sockets(daemons)  # the killed DHT's daemon ended without removing its file


def test_an_averager_whose_dht_ends_before_it_starts_fails_at_once_and_gives_sigint_back():
    """The DHT ends after the averager was made: its start cannot finish (hivemind set SIGINT to
    "ignore" in the caller for the start)."""
    daemons = daemon_socket_files()
    dht = start_dht(host_maddrs=LOOPBACK)

    def handler(signum, frame):
        pass

    before = signal.signal(signal.SIGINT, handler)
    try:
        averager = VerifiedAverager([torch.zeros(4)], dht, prefix="never-ready", start=False)
        dht.kill()
        dht.join(10)
        began = time.monotonic()
        with pytest.raises(AveragerStartFailed, match=r"did not start: .*\(its DHT has ended\)"):
            averager.run_in_background(timeout=600.0)
        assert time.monotonic() - began < 30.0  # at once, not at its bound
        assert not averager.is_alive()  # stopped, not left waiting on the DHT
        assert signal.getsignal(signal.SIGINT) is handler
    finally:
        signal.signal(signal.SIGINT, before)
        remove_dead_daemon_sockets(daemons)


class _FailsAtStart(VerifiedAverager):
    """An averager whose start fails before it reports ready (as one that cannot bind)."""

    async def _serve(self) -> None:
        raise OSError("cannot listen")


def test_an_averager_whose_start_fails_fails_at_once_with_its_reason_not_at_its_bound():
    dht = start_dht(host_maddrs=LOOPBACK)
    try:
        averager = _FailsAtStart([torch.zeros(4)], dht, prefix="fails-at-start", start=False)
        began = time.monotonic()
        with pytest.raises(AveragerStartFailed, match=r"did not start: cannot listen"):
            averager.run_in_background(timeout=600.0)
        assert time.monotonic() - began < 30.0
        assert not averager.is_alive()
        assert averager.exitcode == 1
    finally:
        dht.shutdown()


def test_a_request_to_an_ended_averager_raises_averager_gone_at_once():
    dht = start_dht(host_maddrs=LOOPBACK)
    try:
        averager = VerifiedAverager([torch.zeros(4)], dht, prefix="ends", start=True)
        averager.kill()  # as the OOM killer would take its process
        averager.join(10)
        with pytest.raises(AveragerGone):
            averager.check_alive()
        began = time.monotonic()
        with pytest.raises(AveragerGone, match=r"it ended \(exit code 1\)"):
            averager.set_allreduce_timeout(5.0)
        assert time.monotonic() - began < 5.0
        averager.shutdown()
    finally:
        dht.shutdown()
