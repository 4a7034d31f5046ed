"""The peer's shard cache (size limit, least recently used out first, pins, checked and atomic writes)
and the downloader that fills it from real holders over libp2p on 127.0.0.1."""

from __future__ import annotations

import hashlib
import os
import random
import threading
import time

import pytest

from hivemind_adapter.dht import start_dht, visible_maddrs
from hivemind_adapter.p2p import Endpoint
from hivemind_adapter.shard_transfer import ShardServer
from peer.shard_cache import ShardCache, parse_size
from peer.shard_download import ShardDownloader
from protocol.shards import ShardEntry

LOOPBACK = ["/ip4/127.0.0.1/tcp/0"]
HANDLER = "shard-download-test"
PAGE = 64 * 1024


def _shard(seed: int, size: int = 1000) -> tuple[str, bytes]:
    data = random.Random(seed).randbytes(size)
    return hashlib.sha256(data).hexdigest(), data


def _entry(index: int, digest: str, size: int) -> ShardEntry:
    return ShardEntry(
        index=index,
        split="train",
        digest=digest,
        size=size,
        first_sample=index * 10,
        samples=10,
        format="cifar/chw-u8",
        decoded_shape=(3, 32, 32),
        decoded_bytes=10 * 3072,
    )


# -- the cache ---------------------------------------------------------------------------------


def test_eviction_keeps_the_total_under_the_limit_least_recently_used_first(tmp_path):
    cache = ShardCache(tmp_path, max_bytes=3000)
    a, b, c, d = (_shard(i) for i in range(4))
    for digest, data in (a, b, c):
        cache.put(digest, data)
    assert cache.used_bytes == 3000 and not cache.over_limit
    assert cache.path(a[0]) == tmp_path / f"{a[0]}.shard"  # a used again: b is now the oldest
    cache.put(*d)
    assert cache.used_bytes == 3000 and not cache.over_limit
    assert set(cache.digests()) == {a[0], c[0], d[0]}
    assert not (tmp_path / f"{b[0]}.shard").exists() and cache.path(b[0]) is None
    assert not cache.has(b[0]) and cache.has(a[0])
    cache.put(*b)  # back in: c is the least recently used now
    assert set(cache.digests()) == {a[0], d[0], b[0]}
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"{x}.shard" for x in cache.digests())
    assert (tmp_path / f"{b[0]}.shard").read_bytes() == b[1]


def test_pinned_shards_are_never_evicted_even_over_the_limit(tmp_path):
    cache = ShardCache(tmp_path, max_bytes=2500)
    a, b, c, d = (_shard(i) for i in range(10, 14))
    cache.pin([a[0], b[0], "f" * 64])  # a pin may name a shard not cached yet
    cache.put(*a)
    cache.put(*b)
    cache.put(*c)
    cache.put(*d)  # c goes; a and b are pinned, d was just stored
    assert set(cache.digests()) == {a[0], b[0], d[0]}
    assert cache.used_bytes == 3000 and cache.over_limit
    # Only the put that stored d spares it; an eviction later treats it like any unpinned shard.
    assert cache.evict() == [d[0]] and cache.has(a[0]) and cache.has(b[0]) and not cache.over_limit
    cache.put(*d)
    cache.pin([b[0], d[0]])  # a is unpinned: it goes at once, the oldest
    assert set(cache.digests()) == {b[0], d[0]} and not cache.over_limit
    cache.put(*c)  # the only unpinned one is the one just stored: kept, over the limit
    assert cache.over_limit and cache.has(c[0]) and cache.used_bytes == 3000
    cache.pin([])
    assert cache.used_bytes <= 2500 and not cache.over_limit


def test_a_put_whose_bytes_do_not_hash_to_the_digest_is_refused(tmp_path):
    cache = ShardCache(tmp_path, max_bytes=10_000)
    digest, data = _shard(20)
    with pytest.raises(ValueError, match="hash to"):
        cache.put(digest, data + b"x")
    with pytest.raises(ValueError, match="not a shard digest"):
        cache.put("../" + digest[3:], data)
    assert list(tmp_path.iterdir()) == [] and cache.used_bytes == 0 and not cache.has(digest)
    cache.put(digest, data)
    cache.put(digest, data)  # again: nothing changes
    assert cache.digests() == [digest] and cache.used_bytes == len(data)


def test_on_start_leftovers_go_foreign_files_stay_and_the_limit_holds(tmp_path):
    old, new, other = _shard(30), _shard(31), _shard(32)
    (tmp_path / f"{old[0]}.shard").write_bytes(old[1])
    (tmp_path / f"{new[0]}.shard").write_bytes(new[1])
    (tmp_path / f"{other[0]}.1234abcd.tmp").write_bytes(other[1][:500])  # a write cut short
    (tmp_path / "notes.shard").write_bytes(b"not a shard name")
    (tmp_path / f"{other[0].upper()}.shard").write_bytes(other[1])
    past = time.time() - 100
    os.utime(tmp_path / f"{old[0]}.shard", (past, past))
    cache = ShardCache(tmp_path, max_bytes=10_000)
    assert sorted(cache.digests()) == sorted([old[0], new[0]]) and cache.used_bytes == 2000
    assert not list(tmp_path.glob("*.tmp"))
    assert (tmp_path / "notes.shard").exists() and (tmp_path / f"{other[0].upper()}.shard").exists()
    # A smaller limit on the next start: the least recently written goes.
    assert ShardCache(tmp_path, max_bytes=1500).digests() == [new[0]]
    assert not (tmp_path / f"{old[0]}.shard").exists()


def test_concurrent_puts_keep_index_and_disk_in_step(tmp_path):
    cache = ShardCache(tmp_path, max_bytes=5000)
    shards = [_shard(100 + i) for i in range(40)]
    errors = []

    def put_some(part):
        try:
            for digest, data in part:
                cache.put(digest, data)
                cache.path(digest)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=put_some, args=(shards[i::4],)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert not errors
    assert cache.used_bytes <= 5000
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"{d}.shard" for d in cache.digests())


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("500MB", 500 * 10**6),
        ("2GB", 2 * 10**9),
        ("2GiB", 2 * 2**30),
        ("1.5G", int(1.5 * 2**30)),
        ("1048576", 1048576),
        ("64k", 64 * 1024),
        (" 3 mib ", 3 * 2**20),
        ("10B", 10),
    ],
)
def test_parse_size_reads_the_usual_spellings(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "lots", "2 GX", "-1GB", "0", "1.2.3G", "iB", "5 ib"])
def test_parse_size_refuses_junk_in_one_line(text):
    with pytest.raises(ValueError) as caught:
        parse_size(text)
    assert "\n" not in str(caught.value)


# -- the downloader ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def swarm(tmp_path_factory):
    """A downloading client and two holders, each serving the shards of its own cache."""
    first = start_dht(host_maddrs=LOOPBACK)
    dhts = [first] + [start_dht(host_maddrs=LOOPBACK, initial_peers=visible_maddrs(first)) for _ in range(2)]
    endpoints = [Endpoint(d, f"node-{i}") for i, d in enumerate(dhts)]
    caches = [ShardCache(tmp_path_factory.mktemp(f"holder{i}"), 1 << 30) for i in range(2)]
    servers = []
    try:
        for endpoint, cache in zip(endpoints[1:], caches):
            servers.append(
                ShardServer(endpoint, lambda d, c=cache: c.path(d, touch=False), HANDLER, page_bytes=PAGE)
            )
        yield endpoints[0], caches, [e.peer_id for e in endpoints[1:]]
    finally:
        for server in servers:
            server.close()
        for endpoint in endpoints:
            endpoint.close()
        for dht in dhts:
            dht.shutdown()


def test_shards_dropped_from_a_share_before_they_start_are_never_fetched(swarm, tmp_path):
    """A share that shrinks as the roster grows: queued shards no longer in it are forgotten."""
    client, holders, holder_ids = swarm
    shards = [_shard(900 + i, size=3 * PAGE + i) for i in range(6)]  # seeds no other test uses
    entries = [_entry(i, digest, len(data)) for i, (digest, data) in enumerate(shards)]
    for holder in holders:
        for digest, data in shards:
            holder.put(digest, data)
    cache = ShardCache(tmp_path / "mine", 1 << 30)
    sources = threading.Event()  # holds every fetch until the share has been cut

    def gated(entry):
        sources.wait(timeout=10)
        return list(holder_ids)

    downloader = ShardDownloader(client, cache, gated, parallel=1, handler=HANDLER, page_bytes=PAGE)
    try:
        downloader.want(entries)
        deadline = time.monotonic() + 10
        while not downloader._received and time.monotonic() < deadline:  # the first one is in flight
            time.sleep(0.01)
        assert downloader.retain(entries[:2]) == 4  # 1 in flight stays, 1 kept queued, 4 dropped
        sources.set()
        assert downloader.wait(entries[:2], timeout=20)
        progress = downloader.progress()
    finally:
        downloader.close(timeout=5)
    assert (progress.shards_done, progress.shards_wanted) == (2, 2)
    assert progress.bytes_wanted == sum(e.size for e in entries[:2])
    assert sorted(cache.digests()) == sorted(e.digest for e in entries[:2])


def test_the_downloader_fills_the_cache_with_what_is_wanted(swarm, tmp_path):
    client, holders, holder_ids = swarm
    shards = [_shard(200 + i, size=5 * PAGE + 17 * i) for i in range(4)]
    entries = [_entry(i, digest, len(data)) for i, (digest, data) in enumerate(shards)]
    for holder in holders:
        for digest, data in shards:
            holder.put(digest, data)
    cache = ShardCache(tmp_path / "mine", 1 << 30)
    cache.put(*shards[3])  # already here: not wanted again
    downloader = ShardDownloader(
        client, cache, lambda entry: list(holder_ids), parallel=2, handler=HANDLER, page_bytes=PAGE
    )
    try:
        downloader.want(entries[:2])
        downloader.want(entries)  # the first two again, and the cached one: only the third is new
        assert downloader.wait(entries, timeout=20)
        progress = downloader.progress()
    finally:
        started = time.monotonic()
        downloader.close(timeout=5)
        assert time.monotonic() - started < 6
    sizes = sum(e.size for e in entries[:3])
    assert (progress.shards_done, progress.shards_wanted) == (3, 3)
    assert progress.bytes_done == progress.bytes_wanted == sizes
    assert sum(progress.bytes_by_source.values()) == sizes
    assert set(progress.bytes_by_source) == set(holder_ids)
    assert (progress.failures, progress.last_error) == (0, "")
    for digest, data in shards:
        assert cache.path(digest).read_bytes() == data
    assert not any(t.is_alive() for t in downloader._threads)


def test_a_shard_no_holder_yields_is_retried_with_fresh_sources(swarm, tmp_path):
    client, holders, holder_ids = swarm
    digest, data = _shard(300, size=3 * PAGE)
    holders[1].put(digest, data)  # only the second holder has it
    entry = _entry(0, digest, len(data))
    asked = []

    def sources_for(e: ShardEntry) -> list[str]:
        asked.append(e.digest)
        return [holder_ids[0]] if len(asked) < 3 else [holder_ids[1]]  # the right holder at last

    cache = ShardCache(tmp_path / "mine", 1 << 30)
    downloader = ShardDownloader(
        client, cache, sources_for, parallel=1, handler=HANDLER, retry_delay=(0.05, 0.2), page_bytes=PAGE
    )
    try:
        assert not downloader.wait([entry], timeout=0.05)  # not wanted yet: nothing comes
        downloader.want([entry])
        assert downloader.wait([entry], timeout=20)
        progress = downloader.progress()
    finally:
        downloader.close(timeout=5)
    assert len(asked) == 3
    assert progress.failures == 2 and "does not hold that shard" in progress.last_error
    assert (progress.shards_done, progress.bytes_done) == (1, len(data))
    assert progress.bytes_by_source == {holder_ids[1]: len(data)}
    assert cache.path(digest).read_bytes() == data
