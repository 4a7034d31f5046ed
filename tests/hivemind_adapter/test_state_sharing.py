"""The one state sharer, as peers and the aggregator use it: a serving node's newest state reaches a
newcomer checked against its digest, a node offers nothing before it published a state, and a
client-mode node (behind NAT: it serves nothing) can still download and publish; a sharer whose
process ended says so at once, and its owner is told."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
import torch

from hivemind_adapter.averager_process import AveragerGone
from hivemind_adapter.dht import start_dht, visible_maddrs
from hivemind_adapter.process_answers import ProcessWatch
from hivemind_adapter.state_sharing import StateSharer
from supernet.state import digest

LOOPBACK = ["/ip4/127.0.0.1/tcp/0"]


def _state(seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(300, 100, generator=g), torch.randn(7, generator=g), torch.zeros(3)]


def _download_once_offered(sharer: StateSharer):
    """``sharer``'s download, taken again (bounded) until a served state arrived: a publish declares
    the server in the DHT in the background, so a download right after it may find nobody yet."""
    got = None
    for _ in range(40):
        got = sharer.download(timeout=60)
        if got is not None:
            break
        time.sleep(0.25)
    return got


def test_a_client_mode_node_downloads_the_served_state_and_publishes_its_own():
    server_dht = start_dht(host_maddrs=LOOPBACK)
    client_dht = start_dht(host_maddrs=LOOPBACK, initial_peers=visible_maddrs(server_dht), client_mode=True)
    template = _state(0)
    server = StateSharer(template, server_dht, "share-test", consensus=2)
    client = StateSharer(template, client_dht, "share-test", consensus=2, client_mode=True)
    try:
        served = _state(1)
        served_digest = server.publish(3, served, attempt=5, tiebreak=0.25)
        assert served_digest == digest(served[:2])
        got = _download_once_offered(client)
        assert got is not None and (got.round, got.digest, got.attempt) == (3, served_digest, 5)
        assert all(torch.equal(a, b) for a, b in zip(got.tensors, served))
        # Publishing on a node that cannot serve only records what it holds (nothing is advertised).
        assert client.publish(4, _state(2), attempt=6, tiebreak=0.5) == digest(_state(2)[:2])
        assert client.served["round"] == 4
    finally:
        for part in (client, server):
            part.shutdown()
        client_dht.shutdown()
        server_dht.shutdown()


def test_a_node_offers_its_state_only_once_it_published_one():
    """Peers that start together hold the same initial state: asking each other for it only costs
    their start-up (it used to take a loaded peer its whole download timeout)."""
    first_dht = start_dht(host_maddrs=LOOPBACK)
    second_dht = start_dht(host_maddrs=LOOPBACK, initial_peers=visible_maddrs(first_dht))
    template = _state(0)
    first = StateSharer(template, first_dht, "share-start", consensus=2)
    second = StateSharer(template, second_dht, "share-start", consensus=2)
    try:
        assert second.download(timeout=60) is None
        assert first.downloads_served == 0  # nobody asked it for its initial state
        served_digest = first.publish(0, _state(3), attempt=0, tiebreak=0.3)
        got = _download_once_offered(second)
        assert got is not None and got.digest == served_digest and first.downloads_served == 1
        first.stop_serving(grace=0.0)
        first.publish(1, _state(4), attempt=1, tiebreak=0.3)  # while leaving: recorded, not offered
        assert first.served["round"] == 1 and not first.allow_state_sharing
    finally:
        for part in (second, first):
            part.shutdown()
        second_dht.shutdown()
        first_dht.shutdown()


def test_a_sharer_whose_process_ended_tells_its_owner_once_and_fails_its_calls_at_once():
    """Killed (or out of memory), a sharer serves nothing and a download on it waited its whole
    timeout: the owner is told within a second, and the calls fail at once."""
    dht = start_dht(host_maddrs=LOOPBACK)
    sharer = StateSharer(_state(0), dht, "share-gone", consensus=2)
    told: list[int | None] = []
    once = threading.Event()
    watch = ProcessWatch(sharer, lambda code: (told.append(code), once.set()), every=0.2)
    try:
        sharer.publish(0, _state(1), attempt=0, tiebreak=0.5)
        assert not told  # alive: nothing to tell
        os.kill(sharer.pid, signal.SIGKILL)
        assert once.wait(10.0)
        time.sleep(0.5)  # a second report would come within this
        assert told == [-signal.SIGKILL]
        started = time.monotonic()
        with pytest.raises(AveragerGone, match=r"ended \(exit code -9\)"):
            sharer.download(timeout=600.0)
        with pytest.raises(AveragerGone, match=r"ended \(exit code -9\)"):
            sharer.publish(1, _state(2), attempt=1, tiebreak=0.5)
        assert time.monotonic() - started < 5.0  # not the download's 600 s
    finally:
        watch.stop()
        sharer.remove_socket_file()
        dht.shutdown()


class LyingSharer(StateSharer):
    """A holder that serves its published state with other metadata, or other values, than it holds."""

    meta_lie: dict = {}  # a client's are never used: it serves nothing
    tensor_lie = None  # (index, value) written into the served copy

    def get_current_state(self):
        meta, tensors, infos = super().get_current_state()
        if self.tensor_lie is not None:
            index, value = self.tensor_lie
            tensors[index].fill_(value)
        return {**meta, **self.meta_lie}, tensors, infos


@pytest.mark.parametrize(
    "meta_lie, tensor_lie",
    [
        ({"round": "3; rm -rf"}, None),  # int() of it raised, and nothing caught it
        ({"round": None}, None),
        ({"tiebreak": float("nan")}, None),
        ({"attempt": [1]}, None),
        ({"digest": 7}, None),
        ({}, (2, float("nan"))),  # outside the digest: the batch-norm statistics' place
        ({}, (2, float("inf"))),
    ],
)
def test_a_served_state_with_malformed_metadata_or_non_finite_values_is_refused(meta_lie, tensor_lie):
    server_dht = start_dht(host_maddrs=LOOPBACK)
    client_dht = start_dht(host_maddrs=LOOPBACK, initial_peers=visible_maddrs(server_dht))
    template = _state(0)
    server = LyingSharer(template, server_dht, "lying-share-test", consensus=2)
    server.meta_lie, server.tensor_lie = meta_lie, tensor_lie
    # the same class on both ends (hivemind names its calls after it); the client's download is StateSharer's
    client = LyingSharer(template, client_dht, "lying-share-test", consensus=2)
    try:
        server.publish(3, _state(1), attempt=5, tiebreak=0.25)
        results = []
        deadline = time.monotonic() + 60
        while server.downloads_served == 0 and time.monotonic() < deadline:
            results.append(client.download(timeout=30))
            time.sleep(0.25)
        assert server.downloads_served >= 1, "the client never reached the lying holder"
        assert results[-1] is None and all(r is None for r in results)
    finally:
        for part in (client, server):
            part.shutdown()
        client_dht.shutdown()
        server_dht.shutdown()
