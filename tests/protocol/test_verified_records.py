"""Each signed board entry is verified once: a repeated entry is answered from the cache, a changed
one (new bytes) is verified again, a forged one stays refused, and the cache stays bounded."""

from __future__ import annotations

import time

import pytest

from protocol.dht_schema import commit_subkey, open_commit_value
from protocol.identity import Identity
from protocol.records import RoundCommit
from protocol.sealing import RecordRejected, seal
from protocol.verified_records import VerifiedRecords
from tests.protocol.factories import endorsement_of, peer_id_of

TASK = "cache-test"


def _report(identity: Identity, attempt: int, digest: str = "ab" * 32) -> tuple[str, bytes]:
    record = RoundCommit(
        task_id=TASK, attempt=attempt, peer_id=peer_id_of(identity), public_key=identity.public_key_hex,
        endorsement=endorsement_of(identity), ok=True, digest=digest, timestamp=int(time.time() * 1000), left=False,
    )  # fmt: skip
    return commit_subkey(attempt, identity.public_key_hex), seal(record, identity)


def _cache(capacity: int = 4096) -> VerifiedRecords:
    return VerifiedRecords(lambda sub, value: open_commit_value(TASK, sub, value), capacity)


def test_an_entry_read_again_is_not_verified_again():
    cache, me = _cache(), Identity.generate()
    sub, wire = _report(me, 3)
    first = cache.open(sub, wire)
    assert cache.open(sub, bytes(wire)).record == first.record and first.record.attempt == 3
    assert cache.counts == (1, 1)
    sub2, wire2 = _report(me, 4)  # new bytes: verified
    assert cache.open(sub2, wire2).record.attempt == 4 and cache.counts == (2, 1)


def test_a_forged_entry_stays_refused_and_a_valid_one_under_a_lying_subkey_too():
    cache, me = _cache(), Identity.generate()
    sub, wire = _report(me, 3)
    forged = wire.replace(b"ab" * 32, b"cd" * 32)  # another digest under the same signature
    for _ in range(2):
        with pytest.raises(RecordRejected):
            cache.open(sub, forged)
    with pytest.raises(RecordRejected):
        cache.open(commit_subkey(9, me.public_key_hex), wire)  # the subkey names another attempt
    assert cache.open(sub, wire).record.attempt == 3  # the genuine bytes still open
    assert cache.counts == (3, 1)


def test_the_cache_is_bounded():
    cache, me = _cache(capacity=3), Identity.generate()
    entries = [_report(me, a) for a in range(5)]
    for sub, wire in entries:
        cache.open(sub, wire)
    cache.open(*entries[-1])  # still held
    cache.open(*entries[0])  # evicted: verified again
    assert cache.counts == (6, 1)
