"""Bound identities: a record that speaks for a peer id holds only if that id's libp2p key endorsed
the key that sealed it. Each attack below ran against the validator before the endorsement existed
and was accepted."""

from __future__ import annotations

import os
import stat

import pytest

from protocol.dht_schema import (
    MantaRecordValidator,
    aggregators_key,
    commit_subkey,
    commits_key,
    open_commit_value,
    open_peer_value,
    peers_key,
)
from protocol.identity import Identity, IdentityError
from protocol.peer_keys import Libp2pKey, Speaker, endorsement_holds, peer_id_of, public_key_of
from protocol.records import IdentityBinding, RoundCommit
from protocol.sealing import RecordRejected, RejectReason, seal
from tests.protocol.factories import certificate_wire, endorsement_of, now_ms, seal_unchecked
from tests.protocol.factories import peer_id_of as honest_peer_id_of
from tests.protocol.test_dht_schema import TASK_ID, announcement, peer_entry, record

HONEST, MALLORY = Identity.generate(), Identity.generate()


def _departure(identity: Identity, peer_id: str, endorsement: str) -> RoundCommit:
    return RoundCommit.model_construct(
        task_id=TASK_ID, attempt=7, peer_id=peer_id, public_key=identity.public_key_hex,
        endorsement=endorsement, ok=False, digest="", timestamp=now_ms(), left=True, state="", group="",
        outliers=(), proofs=(), checked=(), refused=(), checking=False,
    )  # fmt: skip


def test_a_peer_id_is_its_libp2p_public_key_and_reads_back():
    key = Libp2pKey.generate()
    assert key.peer_id.startswith("12D3KooW") and public_key_of(key.peer_id) == key.public_key
    assert peer_id_of(key.public_key) == key.peer_id
    # an RSA key's peer id (a SHA-256 multihash) carries no key: nothing can be endorsed under it
    assert public_key_of("QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N") is None
    assert public_key_of("not a peer id") is None and public_key_of("1" * 40) is None


def test_the_endorsement_holds_for_its_pair_only():
    key, other = Libp2pKey.generate(), Libp2pKey.generate()
    endorsement = key.endorse(HONEST.public_key)
    assert endorsement_holds(key.peer_id, HONEST.public_key_hex, endorsement)
    assert not endorsement_holds(other.peer_id, HONEST.public_key_hex, endorsement)
    assert not endorsement_holds(key.peer_id, MALLORY.public_key_hex, endorsement)
    assert not endorsement_holds(key.peer_id, HONEST.public_key_hex, "zz")
    with pytest.raises(ValueError, match="does not endorse"):
        Speaker(MALLORY, key.peer_id, endorsement)


def test_a_forged_departure_in_an_honest_peers_name_is_refused_everywhere():
    """Fresh keys posted departure notices for honest peer ids, and catch-up dropped those peers."""
    honest_peer = honest_peer_id_of(HONEST)
    validator = MantaRecordValidator(TASK_ID)
    own_key = Libp2pKey.generate().endorse(MALLORY.public_key)  # Mallory's own libp2p key's word
    copied = endorsement_of(HONEST)  # the honest peer's endorsement, of the honest key
    for endorsement in (own_key, copied):
        wire = seal_unchecked(_departure(MALLORY, honest_peer, endorsement), MALLORY)
        subkey = commit_subkey(7, MALLORY.public_key_hex)
        assert not validator.validate(record(commits_key(TASK_ID, 7), subkey, wire))
        with pytest.raises(RecordRejected) as refused:
            open_commit_value(TASK_ID, subkey, wire)
        assert refused.value.reason is RejectReason.UNBOUND_PEER
    # the honest peer's own departure holds
    honest = _departure(HONEST, honest_peer, endorsement_of(HONEST))
    honest = RoundCommit.model_validate(honest.model_dump())
    subkey = commit_subkey(7, HONEST.public_key_hex)
    assert validator.validate(record(commits_key(TASK_ID, 7), subkey, seal(honest, HONEST)))


def test_a_binding_of_another_peers_id_is_refused():
    """The aggregator learned a peer id's binding from any entry that claimed it (credit hijack)."""
    hijack = IdentityBinding.model_construct(
        peer_id=honest_peer_id_of(HONEST), public_key=MALLORY.public_key_hex,
        endorsement=Libp2pKey.generate().endorse(MALLORY.public_key), timestamp=now_ms(),
    )  # fmt: skip
    wire = seal_unchecked(hijack, MALLORY)
    validator = MantaRecordValidator(TASK_ID)
    assert not validator.validate(record(aggregators_key(TASK_ID), MALLORY.public_key_hex, wire))
    victim = honest_peer_id_of(HONEST)
    entry = [
        seal(announcement(MALLORY).model_copy(update={"peer_id": victim}), MALLORY),
        wire,
        certificate_wire(MALLORY, task_id=TASK_ID, peer_id=victim),  # even admitted under that id
    ]
    with pytest.raises(RecordRejected) as refused:
        open_peer_value(TASK_ID, MALLORY.public_key_hex, entry)
    assert refused.value.reason is RejectReason.UNBOUND_PEER
    assert not validator.validate(record(peers_key(TASK_ID), MALLORY.public_key_hex, entry))
    assert validator.validate(record(peers_key(TASK_ID), HONEST.public_key_hex, peer_entry(HONEST)))


def test_sealing_refuses_a_record_its_peer_id_did_not_endorse():
    unbound = _departure(HONEST, Libp2pKey.generate().peer_id, endorsement_of(HONEST))
    with pytest.raises(ValueError, match="did not endorse"):
        seal(unbound, HONEST)


def test_a_libp2p_key_file_is_libp2ps_format_private_and_stable(tmp_path):
    path = tmp_path / "libp2p.key"
    key = Libp2pKey.load_or_create(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert Libp2pKey.load_or_create(path).peer_id == key.peer_id
    assert path.read_bytes() == key.private_protobuf() and len(path.read_bytes()) == 68
    path.write_bytes(b"\x08\x00\x12\x05hello")  # an RSA key's header, or anything else
    with pytest.raises(IdentityError, match="not an Ed25519 libp2p key"):
        Libp2pKey.load_or_create(path)
