"""Shards fetched over real libp2p from several holders at once, each holder reading pages from disk:
the pages come from every holder, a holder that lies is named and cannot spoil the shard, a holder
that stalls is dropped without holding the shard up, and no honest holder is one error, in time."""

from __future__ import annotations

import asyncio
import hashlib
import random
import threading
import time
from pathlib import Path

import pytest

from hivemind_adapter.dht import start_dht, visible_maddrs
from hivemind_adapter.p2p import Endpoint
from hivemind_adapter.shard_transfer import ShardServer, ShardUnavailable, fetch_shard
from protocol.pages import page_request, read_page

LOOPBACK = ["/ip4/127.0.0.1/tcp/0"]
HANDLER = "shard-transfer-test"
PAGE = 64 * 1024  # small pages: a dozen of them in a shard of under a MB
SIZE = 12 * PAGE + 321  # 13 pages: every lane of three holders gets a first page


class Holder:
    """A node serving the shard files of its own directory, by digest."""

    def __init__(self, endpoint: Endpoint, directory: Path):
        self.endpoint, self.directory = endpoint, directory
        self.files: dict[str, Path] = {}
        self.server = ShardServer(endpoint, self.files.get, handler=HANDLER, page_bytes=PAGE)

    @property
    def peer_id(self) -> str:
        return self.endpoint.peer_id

    def hold(self, digest: str, data: bytes) -> None:
        path = self.directory / f"{digest}.shard"
        path.write_bytes(data)
        self.files[digest] = path

    def drop(self, digest: str) -> None:
        self.files.pop(digest, None)

    def served(self, digest: str) -> int:
        return self.server.counters()[2].get(digest, 0)


@pytest.fixture(scope="module")
def swarm(tmp_path_factory):
    """A client and three holders, each its own DHT node and daemon."""
    first = start_dht(host_maddrs=LOOPBACK)
    dhts = [first] + [start_dht(host_maddrs=LOOPBACK, initial_peers=visible_maddrs(first)) for _ in range(3)]
    endpoints = [Endpoint(d, f"node-{i}") for i, d in enumerate(dhts)]
    holders = []
    try:
        for i, endpoint in enumerate(endpoints[1:]):
            holders.append(Holder(endpoint, tmp_path_factory.mktemp(f"holder{i}")))
        yield endpoints[0], holders
    finally:
        for holder in holders:
            holder.server.close()
        for endpoint in endpoints:
            endpoint.close()
        for dht in dhts:
            dht.shutdown()


def _shard(seed: int, size: int = SIZE) -> tuple[str, bytes]:
    data = random.Random(seed).randbytes(size)
    return hashlib.sha256(data).hexdigest(), data


def _forged(data: bytes) -> bytes:
    """One byte flipped in every page: any page of it that is used spoils the whole."""
    out = bytearray(data)
    for offset in range(0, len(out), PAGE):
        out[offset + 7] ^= 0xFF
    return bytes(out)


class SlowHandler:
    """A holder's handler that answers nothing for far longer than any stall_timeout here."""

    def __init__(self, endpoint: Endpoint, handler: str):
        self.endpoint, self.handler, self.asked = endpoint, handler, 0
        self._lock = threading.Lock()
        endpoint.serve(handler, self._handle)

    async def _handle(self, payload: bytes, sender: str) -> bytes:
        with self._lock:
            self.asked += 1
        await asyncio.sleep(60)  # cancelled when its endpoint closes
        return b""

    def close(self) -> None:
        self.endpoint.unserve(self.handler)


def test_a_shard_from_three_holders_arrives_whole_with_pages_from_each(swarm):
    client, holders = swarm
    digest, data = _shard(1)
    for holder in holders:
        holder.hold(digest, data)
    received = []
    got = fetch_shard(
        client,
        [h.peer_id for h in holders],
        digest,
        len(data),
        handler=HANDLER,
        timeout=20,
        stall_timeout=5,
        on_bytes=received.append,
        page_bytes=PAGE,
    )
    assert got.data == data
    assert got.bad_sources == ()
    assert set(got.bytes_by_source) == {h.peer_id for h in holders}
    assert all(n > 0 for n in got.bytes_by_source.values()), got.bytes_by_source
    assert sum(got.bytes_by_source.values()) == len(data)  # no page asked twice
    assert sum(received) == len(data)
    assert [holder.served(digest) for holder in holders] == [got.bytes_by_source[h.peer_id] for h in holders]
    assert 0 < got.seconds < 20


def test_a_server_with_bigger_pages_than_asked_is_cut_to_fit(swarm):
    client, holders = swarm
    digest, data = _shard(2)
    holders[0].hold(digest, data)
    got = fetch_shard(
        client, [holders[0].peer_id], digest, len(data), handler=HANDLER, timeout=20, page_bytes=PAGE // 3
    )
    assert got.data == data and got.bytes_by_source == {holders[0].peer_id: len(data)}


def test_a_holder_serving_wrong_bytes_is_named_and_the_shard_still_arrives(swarm):
    client, holders = swarm
    digest, data = _shard(3)
    liar, honest, other = holders
    liar.hold(digest, _forged(data))  # the same name, other bytes
    honest.hold(digest, data)
    other.hold(digest, data)
    got = fetch_shard(
        client,
        [liar.peer_id, honest.peer_id, other.peer_id],
        digest,
        len(data),
        handler=HANDLER,
        timeout=20,
        stall_timeout=5,
        page_bytes=PAGE,
    )
    assert got.data == data
    assert got.bad_sources == (liar.peer_id,)
    assert liar.peer_id not in got.bytes_by_source
    assert liar.served(digest) > 0  # it was asked, and answered: the hash, not an error, caught it


def test_one_flipped_byte_at_the_only_holder_is_refused(swarm):
    client, holders = swarm
    digest, data = _shard(4)
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0x01
    holders[0].hold(digest, bytes(flipped))
    holders[1].drop(digest)
    holders[2].drop(digest)
    started = time.monotonic()
    with pytest.raises(ShardUnavailable, match="fail the hash"):
        fetch_shard(
            client,
            [h.peer_id for h in holders],
            digest,
            len(data),
            handler=HANDLER,
            timeout=10,
            page_bytes=PAGE,
        )
    assert time.monotonic() - started < 10


def test_a_holder_that_stalls_is_dropped_and_its_pages_go_to_the_others(swarm):
    client, holders = swarm
    digest, data = _shard(5)
    handler = "shard-transfer-stall-test"
    slow = SlowHandler(holders[0].endpoint, handler)
    files = {digest: holders[1].directory / f"{digest}.shard"}
    files[digest].write_bytes(data)
    fast = [ShardServer(h.endpoint, files.get, handler=handler, page_bytes=PAGE) for h in holders[1:]]
    try:
        started = time.monotonic()
        got = fetch_shard(
            client,
            [h.peer_id for h in holders],  # the slow one first: its lanes take the first pages
            digest,
            len(data),
            handler=handler,
            timeout=8,
            stall_timeout=1.0,
            page_bytes=PAGE,
        )
        elapsed = time.monotonic() - started
    finally:
        slow.close()
        for server in fast:
            server.close()
    assert got.data == data
    assert slow.asked >= 1
    assert holders[0].peer_id not in got.bytes_by_source and got.bad_sources == ()
    assert 1.0 <= elapsed < 6, elapsed  # one stall, then the others


def test_no_honest_holder_is_shard_unavailable_within_the_timeout(swarm):
    client, holders = swarm
    digest, data = _shard(6)
    for holder in holders:
        holder.drop(digest)
    with pytest.raises(ShardUnavailable, match="does not hold that shard") as caught:
        fetch_shard(client, [h.peer_id for h in holders], digest, len(data), handler=HANDLER, timeout=5)
    assert "\n" not in str(caught.value)
    with pytest.raises(ShardUnavailable, match="no source to ask"):
        fetch_shard(client, [], digest, len(data), handler=HANDLER)
    # Liars everywhere: each named, nothing accepted.
    for holder in holders:
        holder.hold(digest, _forged(data))
    with pytest.raises(ShardUnavailable, match="fail the hash"):
        fetch_shard(
            client,
            [h.peer_id for h in holders],
            digest,
            len(data),
            handler=HANDLER,
            timeout=10,
            page_bytes=PAGE,
        )
    # A holder announcing another size for the digest is refused from its first page.
    holders[0].hold(digest, data + b"x")
    with pytest.raises(ShardUnavailable, match="not 8"):
        fetch_shard(client, [holders[0].peer_id], digest, 8, handler=HANDLER, timeout=5)


def test_a_holder_that_never_answers_costs_the_timeout_and_no_more(swarm):
    client, holders = swarm
    digest, data = _shard(7)
    handler = "shard-transfer-silent-test"
    slow = SlowHandler(holders[0].endpoint, handler)
    try:
        # bounded by the whole fetch's timeout, then by the stall bound
        for timeout, stall_timeout, says in ((1.5, 30, "within 1.5 s"), (10, 0.5, "stalled")):
            started = time.monotonic()
            with pytest.raises(ShardUnavailable, match=says):
                fetch_shard(
                    client,
                    [holders[0].peer_id],
                    digest,
                    len(data),
                    handler=handler,
                    timeout=timeout,
                    stall_timeout=stall_timeout,
                )
            assert time.monotonic() - started < 4
        assert slow.asked >= 2
    finally:
        slow.close()


def test_a_cancelled_fetch_returns_at_once(swarm):
    client, holders = swarm
    digest, data = _shard(8)
    handler = "shard-transfer-cancel-test"
    slow = SlowHandler(holders[0].endpoint, handler)
    cancel = threading.Event()
    timer = threading.Timer(0.3, cancel.set)
    try:
        timer.start()
        started = time.monotonic()
        with pytest.raises(ShardUnavailable, match="cancelled"):
            fetch_shard(client, [holders[0].peer_id], digest, len(data), handler=handler, cancel=cancel)
        assert time.monotonic() - started < 3
    finally:
        timer.cancel()
        slow.close()


def test_the_server_answers_errors_for_what_it_cannot_serve(swarm):
    client, holders = swarm
    digest, data = _shard(9)
    holders[0].hold(digest, data)
    header, _ = read_page(client.call(holders[0].peer_id, HANDLER, page_request(digest, len(data)), 10))
    assert "outside the shard" in header["error"]
    header, _ = read_page(client.call(holders[0].peer_id, HANDLER, b"junk", 10))
    assert "malformed" in header["error"]
    header, page = read_page(client.call(holders[0].peer_id, HANDLER, page_request(digest, PAGE), 10))
    assert header == {"size": len(data), "offset": PAGE} and page == data[PAGE : 2 * PAGE]
