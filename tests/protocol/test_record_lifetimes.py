"""Fresh records (protocol.record_lifetimes): a copy stored to outlive its record, or a record signed
ahead of time, is refused by the real validator and by real hivemind nodes that run it."""

from __future__ import annotations

import time

import msgpack

from protocol.dht_schema import (
    MantaRecordValidator,
    anchor_key,
    commit_subkey,
    commits_key,
    dht_key_id,
    peers_key,
    progress_key,
    task_key,
)
from protocol.identity import Identity
from protocol.record_lifetimes import (
    ANNOUNCE_TTL,
    CLOCK_SLACK_SECONDS,
    COMMIT_MAX_TTL,
    COMMIT_TTL,
    TASK_TTL,
    commit_ttl,
)
from protocol.records import PeerProgress, RoundCommit, StateAnchor
from protocol.sealing import seal
from tests.helpers import two_task_dhts
from tests.protocol.factories import binding_wire, certificate_wire, endorsement_of, now_ms, peer_id_of
from tests.protocol.test_dht_schema import TASK_ID, Record, announcement, task_spec

TEN_YEARS = 10 * 365 * 86400.0


def _pack(x) -> bytes:
    return msgpack.packb(x, use_bin_type=True)


def _peer_entry(peer: Identity, signed_ms: int) -> list[bytes]:
    return [
        seal(announcement(peer).model_copy(update={"timestamp": signed_ms}), peer),
        binding_wire(peer),
        certificate_wire(peer, task_id=TASK_ID),
    ]


def _stored(validator: MantaRecordValidator, key: str, subkey: str, value, expiration: float) -> bool:
    return validator.validate(Record(dht_key_id(key), _pack(subkey), _pack(value), expiration))


def test_an_announcement_lives_its_ttl_from_its_signing_and_no_longer():
    v, peer = MantaRecordValidator(TASK_ID), Identity.generate()
    now = time.time()
    entry = _peer_entry(peer, int(now * 1000))
    key, sub = peers_key(TASK_ID), peer.public_key_hex
    assert _stored(v, key, sub, entry, now + ANNOUNCE_TTL)
    # pinned: a dead peer kept in every roster for ten years
    assert not _stored(v, key, sub, entry, now + TEN_YEARS)
    assert v.rejected == {f"{peers_key(TASK_ID)}:stale_timestamp": 1}


def test_an_old_announcement_stored_again_cannot_shadow_the_fresh_one():
    """hivemind keeps the copy that expires last: an old record re-stored with a later expiration
    than the author's fresh one would win, if its lifetime did not count from its signing."""
    v, peer = MantaRecordValidator(TASK_ID), Identity.generate()
    now = time.time()
    old = _peer_entry(peer, int((now - 300) * 1000))  # its author withdrew it five minutes ago
    assert not _stored(v, peers_key(TASK_ID), peer.public_key_hex, old, now + ANNOUNCE_TTL + 5)


def test_a_record_signed_ahead_of_the_clock_is_refused():
    v, peer = MantaRecordValidator(TASK_ID), Identity.generate()
    ahead = time.time() + 3600  # signed an hour ahead, to live an hour longer
    record = PeerProgress(
        task_id=TASK_ID, peer_id=announcement(peer).peer_id, public_key=peer.public_key_hex,
        endorsement=endorsement_of(peer), round=3,
        samples=64, throughput_milli=1000, loss_micro=2_000_000, cohort_id="host-aa", state_round=2,
        timestamp=int(ahead * 1000),
    )  # fmt: skip
    assert not _stored(v, progress_key(TASK_ID), peer.public_key_hex, seal(record, peer), ahead + 10)
    assert v.rejected == {f"{progress_key(TASK_ID)}:stale_timestamp": 1}


def test_a_task_spec_stored_as_its_author_signed_it_lives_its_ttl_ahead_of_the_store():
    """A second aggregator re-stores the first's spec unchanged: its lifetime counts from the check."""
    v, aggregator = MantaRecordValidator(TASK_ID), Identity.generate()
    spec = seal(task_spec(aggregator), aggregator)
    now = time.time()
    sub = aggregator.public_key_hex
    assert _stored(v, task_key(TASK_ID), sub, spec, now + TASK_TTL)
    assert not _stored(v, task_key(TASK_ID), sub, spec, now + TASK_TTL + 2 * CLOCK_SLACK_SECONDS)


def test_nodes_refuse_to_pin_a_peer_in_the_roster():
    peer = Identity.generate()
    with two_task_dhts(TASK_ID) as (first, second):
        now = time.time()
        entry = _peer_entry(peer, int(now * 1000))
        key, sub = peers_key(TASK_ID), peer.public_key_hex
        assert not second.store(key, entry, now + TEN_YEARS, subkey=sub)
        assert first.get(key, latest=True) is None, "a node stored the pinned copy"
        assert second.store(key, entry, now + ANNOUNCE_TTL, subkey=sub)
        found = first.get(key, latest=True)
        assert found is not None and found.expiration_time <= now + ANNOUNCE_TTL + 1


def test_an_old_anchor_stored_again_cannot_steer_catch_up_to_an_older_state():
    """An aggregator re-signs its anchor at each store; a copy of an anchor it signed two hours ago
    (an older state) re-stored to expire after the fresh one is refused."""
    v, aggregator = MantaRecordValidator(TASK_ID), Identity.generate()
    now = time.time()

    def anchor(signed: float, state_digest: str) -> bytes:
        record = StateAnchor(
            task_id=TASK_ID, round=3, attempt=4, digest=state_digest, timestamp=int(signed * 1000),
            holder=peer_id_of(aggregator),
        )  # fmt: skip
        return seal(record, aggregator)

    key, sub = anchor_key(TASK_ID), aggregator.public_key_hex
    assert _stored(v, key, sub, anchor(now, "aa" * 32), now + 120)
    assert not _stored(v, key, sub, anchor(now - 7200, "bb" * 32), now + 180)


def test_a_commit_report_lives_two_and_a_half_of_its_posters_rounds_within_its_bounds():
    """The board must hold the last committed attempt while the next one runs: on the emulated
    broadband a round takes 120-160 s, and reports that expired after 90 s left joiners no quorum's
    state to find (they loaded the aggregator's and computed a round they could not contribute to)."""
    assert (
        commit_ttl(1.0) == COMMIT_TTL and commit_ttl(144.0) == 360.0 and commit_ttl(3600.0) == COMMIT_MAX_TTL
    )
    v, peer = MantaRecordValidator(TASK_ID), Identity.generate()
    now = time.time()
    report = RoundCommit(
        task_id=TASK_ID, attempt=3, peer_id=peer_id_of(peer), public_key=peer.public_key_hex,
        endorsement=endorsement_of(peer), ok=True, digest="ab" * 16, timestamp=now_ms(),
    )  # fmt: skip
    key, sub = commits_key(TASK_ID, 3), commit_subkey(3, peer.public_key_hex)
    assert _stored(v, key, sub, seal(report, peer), now + COMMIT_MAX_TTL)
    assert not _stored(v, key, sub, seal(report, peer), now + COMMIT_MAX_TTL + 60)
