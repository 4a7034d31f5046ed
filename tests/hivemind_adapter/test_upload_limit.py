"""``--max-upload``: a node whose process tree is capped sends no faster than its cap, over a real
libp2p daemon on 127.0.0.1, and the cap is one shared budget across forked processes."""

from __future__ import annotations

import multiprocessing
import subprocess
import sys
import time

import pytest

from hivemind_adapter.dht import start_dht
from hivemind_adapter.p2p import Endpoint
from hivemind_adapter.upload_limit import SharedTokenBucket

RATE = 1_000_000  # bytes per second
CALLS = 4  # of a 1 MiB blob each


def _fetch_seconds(rate: str) -> float:
    server = subprocess.Popen(
        [sys.executable, "-m", "tests.hivemind_adapter.upload_server", rate],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        maddr = server.stdout.readline().strip()
        assert maddr, "the server printed no address"
        dht = start_dht(initial_peers=[maddr], host_maddrs=["/ip4/127.0.0.1/tcp/0"], client_mode=True)
        endpoint = Endpoint(dht, "upload-client")
        try:
            server_id = maddr.rsplit("/", 1)[-1]
            endpoint.call(server_id, "blob", b"", timeout=60)  # connected and warm
            started = time.monotonic()
            for _ in range(CALLS):
                assert len(endpoint.call(server_id, "blob", b"", timeout=60)) == 2**20
            return time.monotonic() - started
        finally:
            endpoint.close()
            dht.shutdown()
    finally:
        server.stdin.close()
        server.wait(30)


@pytest.mark.swarm
def test_a_capped_node_sends_no_faster_than_its_cap():
    capped = _fetch_seconds(str(RATE))
    # the bucket's burst (half a second of the rate) may pass at once; the rest waits for tokens
    assert capped >= (CALLS * 2**20 - RATE / 2) / RATE * 0.9, capped


def _spend(bucket: SharedTokenBucket, nbytes: int, out) -> None:
    out.put(bucket.take(nbytes))


def test_forked_processes_share_one_budget():
    bucket = SharedTokenBucket(1000.0, burst=1000.0)
    assert bucket.take(1000) == 0.0  # the burst
    queue = multiprocessing.get_context("fork").Queue()
    child = multiprocessing.get_context("fork").Process(target=_spend, args=(bucket, 2000, queue))
    child.start()
    child.join(30)
    waited = queue.get(timeout=5)
    assert 1.5 <= waited <= 2.5, waited  # the child pays for what the parent spent
    assert bucket.take(1000) >= 2.5  # and the parent for what the child spent


def test_a_rate_must_be_positive():
    with pytest.raises(ValueError, match="positive"):
        SharedTokenBucket(0)
