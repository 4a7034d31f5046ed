"""An averager's process: its start is bounded (a DHT whose process ended never lets it get ready),
and hivemind's unawaited timeouts stay out of the log while other errors do not."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import time

import pytest
import torch

from hivemind_adapter.allreduce import VerifiedAverager
from hivemind_adapter.averager_process import AveragerStartFailed, UnawaitedTimeouts
from hivemind_adapter.dht import read_entries, start_dht, store
from hivemind_adapter.p2p_sockets import daemon_socket_files, remove_dead_daemon_sockets

LOOPBACK = ["/ip4/127.0.0.1/tcp/0"]


def test_an_averager_on_a_dead_dht_fails_to_start_within_its_bound_and_gives_sigint_back():
    daemons = daemon_socket_files()
    dht = start_dht(host_maddrs=LOOPBACK)
    dht.kill()  # the DHT's process gone, as when something killed it under a running peer
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
        with pytest.raises(AveragerStartFailed, match="DHT's process has ended"):
            VerifiedAverager([torch.zeros(4)], dht, prefix="dead-dht", start=True)
        assert signal.getsignal(signal.SIGINT) is handler
    finally:
        signal.signal(signal.SIGINT, before)
        remove_dead_daemon_sockets(daemons)  # the killed DHT's daemon ended without removing its file


def test_an_averager_that_never_gets_ready_is_stopped_at_its_bound_and_gives_sigint_back():
    """The DHT's process ends after the averager was made: its process waits on it and never gets
    ready (hivemind set SIGINT to "ignore" in the parent before the fork)."""
    daemons = daemon_socket_files()
    dht = start_dht(host_maddrs=LOOPBACK)

    def handler(signum, frame):
        pass

    before = signal.signal(signal.SIGINT, handler)
    try:
        averager = VerifiedAverager([torch.zeros(4)], dht, prefix="never-ready", start=False)
        dht.kill()
        dht.join(10)
        with pytest.raises(
            AveragerStartFailed, match=r"did not answer within 5 s \(its DHT's process has ended\)"
        ):
            averager.run_in_background(timeout=5.0)
        assert not averager.is_alive()  # stopped, not left waiting on the DHT
        assert signal.getsignal(signal.SIGINT) is handler
    finally:
        signal.signal(signal.SIGINT, before)
        remove_dead_daemon_sockets(daemons)


class _EndsAtStart(VerifiedAverager):
    """An averager whose process ends as it starts, before it reports ready (as one the OOM killer
    takes, or one that fails to bind)."""

    def run(self) -> None:
        os._exit(3)


def test_an_averager_whose_process_ends_while_starting_fails_at_once_not_at_its_bound():
    dht = start_dht(host_maddrs=LOOPBACK)
    try:
        averager = _EndsAtStart([torch.zeros(4)], dht, prefix="ends-at-start", start=False)
        began = time.monotonic()
        with pytest.raises(AveragerStartFailed, match=r"its process ended \(exit code 3\)"):
            averager.run_in_background(timeout=600.0)
        # noticed within a poll or two (plus the second it gives the pipe), not at the 600 s bound
        assert time.monotonic() - began < 30.0
        assert not averager.is_alive()
    finally:
        dht.shutdown()


def _unawaited_task_report(error: BaseException, records: list[logging.LogRecord]) -> None:
    """Let a task nobody awaits end in ``error`` inside ``wait_for``, and collect what asyncio logs."""

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    async def fails():
        raise error

    async def main():
        if isinstance(error, TimeoutError):
            asyncio.create_task(asyncio.wait_for(asyncio.Event().wait(), timeout=0.01))
        else:
            asyncio.create_task(asyncio.wait_for(fails(), timeout=10.0))
        await asyncio.sleep(0.1)

    log = logging.getLogger("asyncio")
    keep, quiet = Keep(), UnawaitedTimeouts()
    log.addHandler(keep)
    log.addFilter(quiet)
    try:
        asyncio.run(main())
        gc.collect()  # asyncio reports an unretrieved exception when the task is collected
    finally:
        log.removeFilter(quiet)
        log.removeHandler(keep)


def test_an_unawaited_wait_for_timeout_is_not_logged_and_any_other_unretrieved_error_is():
    timeouts: list[logging.LogRecord] = []
    _unawaited_task_report(TimeoutError(), timeouts)
    assert timeouts == []
    errors: list[logging.LogRecord] = []
    _unawaited_task_report(ValueError("kept"), errors)
    assert len(errors) == 1 and "Task exception was never retrieved" in errors[0].getMessage()
    assert isinstance(errors[0].exc_info[1], ValueError)
