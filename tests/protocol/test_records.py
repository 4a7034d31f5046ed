"""Wire records: strictness, sealing format, and every reason open_sealed can give."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import ClassVar

import pydantic
import pytest

from protocol.canonical import canonical_json
from protocol.identity import Identity, verify_signature
from protocol.ledger_checkpoint import Checkpoint
from protocol.peer_keys import Libp2pKey
from protocol.records import (
    Affinity,
    ContributionReceipt,
    DeviceInfo,
    IdentityBinding,
    PeerAnnouncement,
    Revocation,
    RoundCommit,
    check_binding,
)
from protocol.sealing import (
    SEALED_TYPES,
    RecordRejected,
    RejectReason,
    SealedRecord,
    make_sealed,
    open_sealed,
    parse_sealed,
    seal,
)
from protocol.task_spec import SwarmParams, TaskSpec
from tests.protocol.factories import (
    TASK,
    binding_wire,
    endorsement_of,
    fake_peer_id,
    now_ms,
    peer_id_of,
    receipt,
    resign,
)

PEER = Identity.from_seed(b"\x01" * 32)
OTHER = Identity.from_seed(b"\x02" * 32)
AGG = Identity.from_seed(b"\x03" * 32)


def _body(wire: bytes) -> dict:
    return json.loads(wire.split(b"\n")[1])


def _rejected(wire, expected=ContributionReceipt) -> RecordRejected:
    with pytest.raises(RecordRejected) as err:
        open_sealed(wire, expected)
    return err.value


def _task() -> TaskSpec:
    return TaskSpec(
        task_id=TASK,
        task="cifar10-ofa",
        mode="data",
        seed=1234,
        params=SwarmParams(
            target_samples_per_round=4096,
            subnets_per_step=4,
            batch_size=64,
            max_group_size=16,
            round_timeout_ms=60_000,
            receipt_window_ms=600_000,
            learning_rate="0.05",
        ),
        aggregator_keys=(AGG.public_key_hex,),
        ledger_origin="manta.example/cifar10-ofa",
        timestamp=now_ms(),
    )


def _announcement() -> PeerAnnouncement:
    return PeerAnnouncement(
        task_id=TASK,
        peer_id=peer_id_of(PEER),
        public_key=PEER.public_key_hex,
        devices=(DeviceInfo(kind="cuda", name="NVIDIA H200", memory_mb=143_771),),
        throughput_milli=1_250_500,
        affinity=Affinity(host_id="ab" * 16, network_id="cd" * 8),
        cohort_id="host-ab",
        timestamp=now_ms(),
    )


RECORDS = {
    "task": (_task, AGG),
    "announce": (_announcement, PEER),
    "binding": (
        lambda: IdentityBinding(
            peer_id=peer_id_of(PEER),
            public_key=PEER.public_key_hex,
            endorsement=endorsement_of(PEER),
            timestamp=now_ms(),
        ),
        PEER,
    ),
    "receipt": (lambda: receipt(PEER, 1), PEER),
    "revocation": (
        lambda: Revocation(
            task_id=TASK, entry_index=3, entry_leaf_hash="aa" * 32, reason="bad gradient", timestamp=1
        ),
        AGG,
    ),
}


@pytest.mark.parametrize("kind", RECORDS)
def test_every_record_seals_and_opens(kind):
    make, signer = RECORDS[kind]
    record = make()
    wire = seal(record, signer)
    prefix, body, trailer = wire.split(b"\n")
    assert prefix == f"manta/{kind}/v{type(record).VERSION}".encode()
    endorsed = {"receipt", "binding", "commit", "declaration", "progress"}  # v2: roots; libp2p endorsements
    assert type(record).VERSION == (2 if kind in endorsed else 1)
    assert body == canonical_json(record.model_dump(mode="json"))
    assert trailer == b"ed25519 " + signer.public_key_hex.encode() + b" " + trailer.split(b" ")[2]
    opened = open_sealed(wire, type(record))
    assert opened.record == record
    assert opened.public_key == signer.public_key
    assert opened.message == prefix + b"\n" + body  # the exact signed bytes
    assert verify_signature(signer.public_key, opened.message, opened.signature)
    assert opened.wire == wire
    assert parse_sealed(wire, type(record)).record == record
    with pytest.raises(pydantic.ValidationError):
        record.timestamp = 5  # frozen


def test_receipt_fields_and_credit():
    r = receipt(PEER, 7, samples=100, flops_per_sample=3_000)
    assert r.credit == 300_000
    for field in (
        "task_id round peer_id public_key seq cohort_id subnet_hashes samples flops_per_sample "
        "grad_commitment state_digest group_id group_root group_size group_index group_proof timestamp"
    ).split():
        assert field in ContributionReceipt.model_fields
    with pytest.raises(pydantic.ValidationError, match="inside the group"):
        receipt(PEER, 1, group_index=2, group_size=2)
    with pytest.raises(pydantic.ValidationError, match="twice"):
        receipt(PEER, 1, subnet_hashes=("aa" * 32, "aa" * 32))


def test_strings_are_printable_ascii_and_bounded():
    with pytest.raises(pydantic.ValidationError):
        DeviceInfo(kind="cuda", name="caf\u00e9", memory_mb=1)
    with pytest.raises(pydantic.ValidationError):
        receipt(PEER, 1, cohort_id="x" * 129)
    with pytest.raises(pydantic.ValidationError):
        Checkpoint(origin="has space", size=1, root="aa" * 32)
    with pytest.raises(pydantic.ValidationError):
        Checkpoint(origin="\u00e9t\u00e9", size=1, root="aa" * 32)


def test_seal_refuses_a_key_the_record_does_not_name():
    with pytest.raises(ValueError):
        seal(receipt(PEER, 1), OTHER)
    with pytest.raises(ValueError):
        seal(_task(), PEER)  # a task is sealed by one of its aggregator keys


# -- every reason open_sealed gives ----------------------------------------------------------------


def _wire() -> bytes:
    return seal(receipt(PEER, 1), PEER)


def _edit(**changes) -> bytes:
    """A properly signed receipt whose JSON has ``changes`` (``...`` deletes a field), keys sorted, compact."""
    body = _body(_wire())
    for key, value in changes.items():
        if value is ...:
            del body[key]
        else:
            body[key] = value
    return resign(_wire(), PEER, json.dumps(body, sort_keys=True, separators=(",", ":")).encode())


def test_malformed():
    wire = _wire()
    for bad in [
        b"",
        b"garbage",
        wire.replace(b"\n", b"", 1),  # two lines
        wire + b"\n",  # four lines
        b"manta/receipt\n" + wire.split(b"\n", 1)[1],  # no version
        wire.rsplit(b"\n", 1)[0] + b"\ned25519 zz",  # signature line
        resign(wire, PEER, b'{"task_id":'),  # not JSON
        resign(wire, PEER, b"[1,2]"),  # not an object
        _edit(seq=...),  # missing field
        _edit(seq=-1),  # out of range
        _edit(seq=2**53),  # beyond the safe integer range
        _edit(grad_commitment="XY" * 32),  # pattern
        _edit(peer_id="0OIl" * 5),  # not base58
        "not bytes",
    ]:
        assert _rejected(bad).reason is RejectReason.MALFORMED, bad


def test_unknown_field():
    error = _rejected(_edit(bonus_credit=10**9))
    assert error.reason is RejectReason.UNKNOWN_FIELD and "bonus_credit" in error.detail


def test_wrong_type():
    for bad in [
        _edit(samples="256"),
        _edit(samples=True),
        _edit(group_proof="x"),
        _edit(subnet_hashes=[1]),
    ]:
        assert _rejected(bad).reason is RejectReason.WRONG_TYPE
    float_body = canonical_json(_body(_wire())).replace(b'"samples":256', b'"samples":256.5')
    assert _rejected(resign(_wire(), PEER, float_body)).reason is RejectReason.WRONG_TYPE


def test_oversize():
    assert _rejected(_wire() + b"x" * 40_000).reason is RejectReason.OVERSIZE  # the wire form
    assert _rejected(_edit(cohort_id="a" * 500)).reason is RejectReason.OVERSIZE  # a string
    proof = ["ab" * 32] * 65  # more hashes than any tree of 2^64 leaves needs
    assert _rejected(_edit(group_proof=proof)).reason is RejectReason.OVERSIZE  # a list


def test_non_canonical():
    body = canonical_json(_body(_wire()))
    spaced = body.replace(b'","', b'", "', 1)
    reordered = json.dumps(
        dict(reversed(_body(_wire()).items())), separators=(",", ":")
    ).encode()  # not sorted
    assert reordered != body
    duplicated = body[:-1] + b',"seq":1}'
    for bad in (spaced, reordered, duplicated):
        assert _rejected(resign(_wire(), PEER, bad)).reason is RejectReason.NON_CANONICAL


def test_wrong_record_and_unsupported_version():
    assert _rejected(binding_wire(PEER)).reason is RejectReason.WRONG_RECORD
    assert (
        _rejected(_wire().replace(b"manta/receipt/", b"manta/payment/", 1)).reason
        is RejectReason.WRONG_RECORD
    )
    assert (
        _rejected(_wire().replace(b"manta/receipt/v2", b"manta/receipt/v1", 1)).reason
        is RejectReason.UNSUPPORTED_VERSION
    )
    assert open_sealed(
        binding_wire(PEER), (ContributionReceipt, IdentityBinding)
    ).record.peer_id == peer_id_of(PEER)
    # another record type is the wrong record in any version
    assert _rejected(binding_wire(PEER).replace(b"/v1\n", b"/v9\n", 1)).reason is RejectReason.WRONG_RECORD


def test_every_sealed_record_type_has_its_own_prefix():
    from protocol import records, task_spec

    defined = {
        cls
        for module in (records, task_spec)
        for cls in vars(module).values()
        if isinstance(cls, type) and issubclass(cls, SealedRecord) and cls is not SealedRecord
    }
    assert len(defined) == 10
    assert set(SEALED_TYPES.values()) >= defined
    assert all(SEALED_TYPES[(cls.RECORD_TYPE, cls.VERSION)] is cls for cls in defined)
    with pytest.raises(TypeError, match="receipt v2 is already ContributionReceipt"):

        class Forged(SealedRecord):
            RECORD_TYPE: ClassVar[str] = "receipt"
            VERSION: ClassVar[int] = 2

    assert SEALED_TYPES[("receipt", 2)] is ContributionReceipt


def test_opening_finds_a_type_whatever_else_was_imported():
    # Opening looks only among the expected classes, so no import order can hide a record type.
    code = (
        "from protocol.identity import Identity\n"
        "from protocol.sealing import RecordRejected, open_sealed, seal\n"
        "from protocol.task_spec import SwarmParams, TaskSpec\n"
        "import sys\n"
        "assert 'protocol.records' not in sys.modules\n"
        "key = Identity.from_seed(bytes(32))\n"
        "params = SwarmParams(target_samples_per_round=1, subnets_per_step=1, batch_size=1,\n"
        "    max_group_size=1, round_timeout_ms=1, receipt_window_ms=1, learning_rate='0.1')\n"
        "spec = TaskSpec(task_id='t', task='digits', mode='data', seed=1, params=params,\n"
        "    aggregator_keys=(key.public_key.hex(),), ledger_origin='o', timestamp=1)\n"
        "assert open_sealed(seal(spec, key), TaskSpec).record == spec\n"
        "try:\n"
        "    open_sealed(sys.stdin.buffer.read(), TaskSpec)\n"
        "except RecordRejected as e:\n"
        "    print(e.reason.value)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        input=_wire(),
        capture_output=True,
        timeout=120,
        check=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.stdout.decode().strip() == "wrong_record"


def test_bad_signature():
    wire = _wire()
    sig_at = wire.rindex(b" ") + 1
    flipped = wire[:sig_at] + (b"0" if wire[sig_at : sig_at + 1] != b"0" else b"1") + wire[sig_at + 1 :]
    assert _rejected(flipped).reason is RejectReason.BAD_SIGNATURE
    altered = wire.replace(b'"samples":256', b'"samples":999')  # body changed after signing
    assert _rejected(altered).reason is RejectReason.BAD_SIGNATURE
    # properly signed, but by a key other than the receipt's public_key
    stolen = wire.split(b"\n")[0] + b"\n" + wire.split(b"\n")[1]
    stolen += b"\ned25519 " + OTHER.public_key_hex.encode() + b" " + OTHER.sign(stolen).hex().encode()
    assert _rejected(stolen).reason is RejectReason.BAD_SIGNATURE
    task_by_peer = _task().model_dump(mode="json")
    message = b"manta/task/v1\n" + canonical_json(task_by_peer)
    forged = message + b"\ned25519 " + PEER.public_key_hex.encode() + b" " + PEER.sign(message).hex().encode()
    assert _rejected(forged, TaskSpec).reason is RejectReason.BAD_SIGNATURE


# -- identity binding ------------------------------------------------------------------------------


def test_check_binding():
    sealed = make_sealed(receipt(PEER, 1), PEER)
    peer = peer_id_of(PEER)
    binding = open_sealed(binding_wire(PEER), IdentityBinding)
    check_binding(sealed, binding, peer)  # accepted: no exception

    cases = [
        (binding, fake_peer_id(b"mallory")),  # came from another peer
        (binding, None),  # sender unknown
        (open_sealed(binding_wire(OTHER), IdentityBinding), peer),  # binding of another key
        (
            open_sealed(binding_wire(PEER, Libp2pKey.generate()), IdentityBinding),
            peer,
        ),  # key bound elsewhere
    ]
    for bad_binding, sender in cases:
        with pytest.raises(RecordRejected) as err:
            check_binding(sealed, bad_binding, sender)
        assert err.value.reason is RejectReason.UNBOUND_PEER


def test_a_commit_marker_carries_checks_only():
    identity = Identity.generate()
    base = dict(task_id=TASK, attempt=3, peer_id=peer_id_of(identity), public_key=identity.public_key_hex,
                endorsement=endorsement_of(identity), timestamp=now_ms(), checked=("ab" * 32,),
                checking=True)  # fmt: skip
    marker = RoundCommit(ok=False, digest="", **base)
    assert open_sealed(seal(marker, identity), RoundCommit).record.checked == ("ab" * 32,)
    refusing = RoundCommit(ok=False, digest="", **base, refused=(fake_peer_id(b"liar"),))
    assert open_sealed(seal(refusing, identity), RoundCommit).record.refused == (fake_peer_id(b"liar"),)
    for claim in (dict(ok=True, digest="cd" * 32), dict(ok=False, digest="", left=True)):
        with pytest.raises(pydantic.ValidationError, match="checks only"):
            RoundCommit(**{**base, **claim})
    with pytest.raises(pydantic.ValidationError):  # a check token is a SHA-256, nothing else
        RoundCommit(ok=False, digest="", **{**base, "checked": ("not a token",)})
