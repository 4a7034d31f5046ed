"""The MANTA record validator, on real sealed records and on a real two-node hivemind DHT."""

from __future__ import annotations

import dataclasses
import pickle
import time

import msgpack
import pytest

from protocol.declarations import declaration_subkey
from protocol.dht_schema import (
    COMMIT_BUCKETS,
    MantaRecordValidator,
    commit_subkey,
    commits_key,
    dht_key_id,
    peers_key,
    task_key,
)
from protocol.identity import Identity
from protocol.records import AveragingDeclaration, DeviceInfo, PeerAnnouncement, RoundCommit
from protocol.sealing import seal
from protocol.task_spec import TaskSpec
from tests.protocol.factories import (
    binding_wire,
    certificate_wire,
    endorsement_of,
    now_ms,
    peer_id_of,
    resign,
)
from tests.protocol.factories import task_spec as make_task_spec

TASK_ID = "digits-test"


def task_spec(aggregator: Identity, task_id: str = TASK_ID) -> TaskSpec:
    return make_task_spec(aggregator, task_id)


def announcement(peer: Identity, task_id: str = TASK_ID) -> PeerAnnouncement:
    return PeerAnnouncement(
        task_id=task_id,
        peer_id=peer_id_of(peer),
        public_key=peer.public_key_hex,
        devices=(DeviceInfo(kind="cpu", name="test cpu", memory_mb=1024),),
        throughput_milli=250_000,
        affinity={"host_id": "aa" * 8, "network_id": "bb" * 4},
        cohort_id="host-aa",
        timestamp=now_ms(),
    )


def peer_entry(peer: Identity, task_id: str = TASK_ID) -> list[bytes]:
    """A member's entry of ``manta_T_peers``: announcement, binding, certificate."""
    return [
        seal(announcement(peer, task_id), peer),
        binding_wire(peer),
        certificate_wire(peer, task_id=task_id),
    ]


@dataclasses.dataclass
class Record:  # the shape of hivemind's DHTRecord
    key: bytes
    subkey: bytes
    value: bytes
    expiration_time: float = 0.0


def record(key: str, subkey, value) -> Record:
    pack = lambda x: msgpack.packb(x, use_bin_type=True)  # noqa: E731
    return Record(
        dht_key_id(key), pack(subkey), pack(value), time.time() + 10
    )  # within every family's lifetime


def test_key_ids_match_hivemind():
    from hivemind.dht.routing import DHTID

    for key in (task_key(TASK_ID), peers_key(TASK_ID), "anything else"):
        assert dht_key_id(key) == DHTID.generate(source=key).to_bytes()


def test_validator_accepts_valid_records_and_rejects_forgeries():
    aggregator, peer, mallory = Identity.generate(), Identity.generate(), Identity.generate()
    v = MantaRecordValidator(TASK_ID)
    task_wire = seal(task_spec(aggregator), aggregator)
    assert v.validate(record(task_key(TASK_ID), aggregator.public_key_hex, task_wire))
    # Owner subkey must be the signer; a TaskSpec signed by a non-aggregator key does not seal at all.
    assert not v.validate(record(task_key(TASK_ID), mallory.public_key_hex, task_wire))
    forged = task_wire.replace(b'"seed":7', b'"seed":8')
    assert not v.validate(record(task_key(TASK_ID), aggregator.public_key_hex, forged))
    other_task = seal(task_spec(aggregator, "other-task"), aggregator)
    assert not v.validate(record(task_key(TASK_ID), aggregator.public_key_hex, other_task))
    assert not v.validate(record(task_key(TASK_ID), aggregator.public_key_hex, "not bytes"))
    assert not v.validate(Record(dht_key_id(task_key(TASK_ID)), b"\xc1", b"\xc1"))

    peer_value = peer_entry(peer)
    assert v.validate(record(peers_key(TASK_ID), peer.public_key_hex, peer_value))
    assert not v.validate(
        record(peers_key(TASK_ID), peer.public_key_hex, [peer_value[0], binding_wire(mallory), peer_value[2]])
    )
    assert not v.validate(record(peers_key(TASK_ID), peer.public_key_hex, peer_value[:1]))
    assert not v.validate(record(peers_key(TASK_ID), peer.public_key_hex, peer_value[:2]))  # no certificate
    assert not v.validate(record(peers_key(TASK_ID), mallory.public_key_hex, peer_value))
    # Keys that are not MANTA's pass through (but not hivemind's unsigned averaging declarations: a
    # bare boolean is refused under any key, see the declaration test below)
    assert v.validate(record("bench_flat.all_averagers", "x", 1.5))
    assert sum(v.rejected.values()) == 9
    assert any(label.startswith(f"{task_key(TASK_ID)}:bad_signature") for label in v.rejected)


def test_commit_reports_must_be_sealed_by_the_key_their_subkey_names():
    peer, mallory = Identity.generate(), Identity.generate()
    v = MantaRecordValidator(TASK_ID)

    def commit(identity, attempt=3, ok=True, task_id=TASK_ID):
        return RoundCommit(
            task_id=task_id,
            attempt=attempt,
            peer_id=peer_id_of(identity),
            public_key=identity.public_key_hex,
            endorsement=endorsement_of(identity),
            ok=ok,
            digest="ab" * 16,
            timestamp=now_ms(),
        )

    good = seal(commit(peer), peer)
    assert v.validate(record(commits_key(TASK_ID, 3), commit_subkey(3, peer.public_key_hex), good))
    # Mallory cannot post a failure in the peer's name, nor file a report under another attempt.
    assert not v.validate(
        record(
            commits_key(TASK_ID, 3),
            commit_subkey(3, peer.public_key_hex),
            seal(commit(mallory, ok=False), mallory),
        )
    )
    assert not v.validate(record(commits_key(TASK_ID, 3), commit_subkey(4, peer.public_key_hex), good))
    assert not v.validate(
        record(
            commits_key(TASK_ID, 3),
            commit_subkey(3, peer.public_key_hex),
            seal(commit(peer, task_id="other"), peer),
        )
    )
    assert not v.validate(
        record(commits_key(TASK_ID, 3), commit_subkey(3, peer.public_key_hex), {"ok": False})
    )
    # The board is spread over buckets by attempt: a report belongs in its attempt's bucket only
    # (elsewhere nobody would read it), and attempts COMMIT_BUCKETS apart share one.
    assert commits_key(TASK_ID, 3) != commits_key(TASK_ID, 4)
    assert commits_key(TASK_ID, 3 + COMMIT_BUCKETS) == commits_key(TASK_ID, 3)
    assert not v.validate(record(commits_key(TASK_ID, 4), commit_subkey(3, peer.public_key_hex), good))
    later = seal(commit(peer, attempt=3 + COMMIT_BUCKETS), peer)
    assert v.validate(
        record(commits_key(TASK_ID, 3), commit_subkey(3 + COMMIT_BUCKETS, peer.public_key_hex), later)
    )
    assert v.rejected.get(f"{commits_key(TASK_ID, 4)}:malformed") == 1, v.rejected


def test_the_validator_checks_each_distinct_entry_once_and_still_drops_every_forged_copy():
    """hivemind validates every entry of every lookup's answer: the same bytes get one signature
    check, however often they come back; a forgery is dropped (and counted) each time."""
    peer, mallory = Identity.generate(), Identity.generate()
    v = MantaRecordValidator(TASK_ID)

    def commit_by(identity: Identity) -> bytes:
        return seal(
            RoundCommit(
                task_id=TASK_ID, attempt=3, peer_id=peer_id_of(identity), public_key=identity.public_key_hex,
                endorsement=endorsement_of(identity), ok=True, digest="ab" * 16, timestamp=now_ms(),
            ),
            identity,
        )  # fmt: skip

    good = record(commits_key(TASK_ID, 3), commit_subkey(3, peer.public_key_hex), commit_by(peer))
    # Mallory's report filed under the peer's subkey: in the peer's name.
    forged = record(commits_key(TASK_ID, 3), commit_subkey(3, peer.public_key_hex), commit_by(mallory))
    assert all(v.validate(good) for _ in range(3))
    assert not any(v.validate(forged) for _ in range(2))
    assert v.counts == (2, 3)  # two distinct entries checked; two repeats of one, one of the other
    assert v.rejected == {f"{commits_key(TASK_ID, 3)}:bad_signature": 2}
    # The same bytes under another key are another entry (the bucket is part of what is checked).
    assert not v.validate(
        record(commits_key(TASK_ID, 4), commit_subkey(3, peer.public_key_hex), commit_by(peer))
    )
    # Without a cache every copy is checked again; the capacity survives the pipe to the DHT process.
    uncached = pickle.loads(pickle.dumps(MantaRecordValidator(TASK_ID, cache_capacity=0)))
    assert uncached.cache_capacity == 0
    assert all(uncached.validate(good) for _ in range(3)) and uncached.counts == (3, 0)


def test_odd_values_under_every_manta_key_are_refused_never_raised():
    """Whatever bytes a stranger stores under a MANTA key, the validator answers False (and counts
    it); an exception would escape into hivemind's request handling instead."""
    v = MantaRecordValidator(TASK_ID, cache_capacity=0)
    keys = [task_key(TASK_ID), peers_key(TASK_ID), commits_key(TASK_ID, 0), commits_key(TASK_ID, 7)]
    odd_values = [
        None,
        5,
        -1.5,
        "text",
        b"\xff\x00",
        [],
        [b"a"],
        [1, 2],
        {"a": 1},
        {1: [b"x"]},
        [[b"a"], b"b"],
    ]
    odd_subkeys = [None, 3, "3/ab", b"\x00", [1]]
    for key in keys:
        for subkey in odd_subkeys:
            for value in odd_values:
                assert not v.validate(record(key, subkey, value)), (key, subkey, value)
    garbled = Record(dht_key_id(keys[0]), b"\xc1", b"\xc1", time.time() + 60)  # 0xc1: never valid msgpack
    assert not v.validate(garbled)
    assert sum(v.rejected.values()) == len(keys) * len(odd_subkeys) * len(odd_values) + 1


@pytest.mark.swarm
def test_nodes_with_the_validator_drop_forged_records():
    import hivemind
    from hivemind.utils import get_dht_time

    aggregator, mallory = Identity.generate(), Identity.generate()
    first = hivemind.DHT(
        host_maddrs=["/ip4/127.0.0.1/tcp/0"], record_validators=[MantaRecordValidator(TASK_ID)], start=True
    )
    second = hivemind.DHT(
        initial_peers=[str(m) for m in first.get_visible_maddrs()],
        host_maddrs=["/ip4/127.0.0.1/tcp/0"],
        start=True,
    )
    second.add_validators([MantaRecordValidator(TASK_ID)])
    try:
        exp = get_dht_time() + 60
        good = seal(task_spec(aggregator), aggregator)
        forged = good.replace(b'"seed":7', b'"seed":9')
        assert second.store(task_key(TASK_ID), good, exp, subkey=aggregator.public_key_hex)
        assert not second.store(task_key(TASK_ID), forged, exp, subkey=mallory.public_key_hex)
        found = first.get(task_key(TASK_ID), latest=True)
        assert found is not None and set(found.value) == {aggregator.public_key_hex}
        assert found.value[aggregator.public_key_hex].value == good
    finally:
        second.shutdown()
        first.shutdown()


def _declaration(peer: Identity, group_key: str, *, task_id: str = TASK_ID) -> bytes:
    return seal(
        AveragingDeclaration(
            task_id=task_id,
            group_key=group_key,
            peer_id=peer_id_of(peer),
            public_key=peer.public_key_hex,
            endorsement=endorsement_of(peer),
            looking=True,
            expiration_ms=now_ms() + 2000,
        ),
        peer,
    )


def test_averaging_declarations_must_be_signed_and_name_the_key_they_are_stored_under():
    """hivemind's group keys reach the validator as ids only: a declaration carries its key's name,
    and the validator checks that name, its task, and that the subkey is the signer's own."""
    validator = MantaRecordValidator(TASK_ID)
    peer, other = Identity.generate(), Identity.generate()
    key = f"{TASK_ID}_cohort_a.0b0110"
    subkey = declaration_subkey(peer_id_of(peer), peer.public_key_hex)
    assert validator.validate(record(key, subkey, _declaration(peer, key)))
    # hivemind's own unsigned declaration (subkey: the peer id's bytes, value: a bare boolean)
    assert not validator.validate(record(key, b"\x00\x24" + bytes(34), True))
    assert not validator.validate(record(key, b"\x00\x24" + bytes(34), False))
    # a valid declaration copied under another group key (the one it names hashes elsewhere)
    assert not validator.validate(record(f"{TASK_ID}_cohort_b.0b0110", subkey, _declaration(peer, key)))
    # another task's key, even under its own name
    foreign = "other-task_cohort_a.0b0110"
    assert not validator.validate(record(foreign, subkey, _declaration(peer, foreign, task_id="other-task")))
    # stored under another key's subkey: it would overwrite that key's entry
    other_subkey = declaration_subkey(peer_id_of(peer), other.public_key_hex)
    assert not validator.validate(record(key, other_subkey, _declaration(peer, key)))
    # a forged signature
    wire = _declaration(peer, key)
    assert not validator.validate(record(key, subkey, resign(wire, other, wire.split(b"\n")[1])))
    # entries that are neither declarations nor booleans (hivemind's state-sharing priorities) pass
    assert validator.validate(record(f"{TASK_ID}_state.all_averagers", b"\x00\x24" + bytes(34), 1.5))
    assert validator.rejected == {"group_key:unsigned": 2, "group_key:wrong_task": 1, "group_key:malformed": 1,
                                  "group_key:unbound_peer": 1, "group_key:bad_signature": 1}  # fmt: skip
