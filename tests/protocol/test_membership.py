"""Membership certificates: who counts in a task is whom one of its aggregators admitted."""

from __future__ import annotations

import pydantic
import pytest

from protocol.dht_schema import MantaRecordValidator, open_withdrawal_value, peers_key, withdrawals_key
from protocol.identity import Identity
from protocol.membership import (
    MAX_VALIDITY_MS,
    AdmissionRequest,
    MembershipCertificate,
    MembershipWithdrawal,
    certificate_problem,
)
from protocol.sealing import RecordRejected, RejectReason, make_sealed, open_sealed, seal
from tests.protocol.factories import ADMITTING_AGGREGATOR, binding_wire, certificate_wire, now_ms, peer_id_of
from tests.protocol.test_dht_schema import TASK_ID, announcement, peer_entry, record

PEER, SYBIL = Identity.generate(), Identity.generate()
KEYS = frozenset({ADMITTING_AGGREGATOR.public_key_hex})


def _problem(wire: bytes, member: Identity = PEER, at: int | None = None) -> str | None:
    certificate = open_sealed(wire, MembershipCertificate)
    now = now_ms() if at is None else at
    return certificate_problem(certificate, TASK_ID, KEYS, member.public_key_hex, peer_id_of(member), now)


def test_a_certificate_holds_for_its_key_peer_and_task_while_it_lives():
    wire = certificate_wire(PEER, task_id=TASK_ID)
    assert _problem(wire) is None
    assert "another key" in _problem(wire, member=SYBIL)
    assert "expired" in _problem(wire, at=now_ms() + 3600 * 1000 + 1)
    assert "in the future" in _problem(certificate_wire(PEER, task_id=TASK_ID, issued_ms=now_ms() + 600_000))
    assert "task" in _problem(certificate_wire(PEER, task_id="other-task"))
    self_signed = certificate_wire(SYBIL, aggregator=SYBIL, task_id=TASK_ID)  # a throw-away key's own
    assert "not signed by an aggregator" in _problem(self_signed, member=SYBIL)


def test_a_certificate_lives_at_most_a_week():
    with pytest.raises(pydantic.ValidationError, match="at most a week"):
        certificate_wire(PEER, lives_ms=MAX_VALIDITY_MS + 1)
    with pytest.raises(pydantic.ValidationError):
        certificate_wire(PEER, lives_ms=0)


def test_validators_that_know_the_aggregators_refuse_announcements_of_keys_they_did_not_admit():
    strict = MantaRecordValidator(TASK_ID, aggregator_keys=tuple(KEYS))
    lenient = MantaRecordValidator(TASK_ID)  # a node that does not know the task's aggregators yet
    where = peers_key(TASK_ID)
    member = peer_entry(PEER)
    sybil = [seal(announcement(SYBIL), SYBIL), binding_wire(SYBIL), certificate_wire(SYBIL, SYBIL, TASK_ID)]
    bare = sybil[:2]
    expired = [*member[:2], certificate_wire(PEER, task_id=TASK_ID, issued_ms=now_ms() - 7200_000)]
    assert strict.validate(record(where, PEER.public_key_hex, member))
    assert not strict.validate(record(where, SYBIL.public_key_hex, sybil))
    assert lenient.validate(record(where, SYBIL.public_key_hex, sybil))  # readers still refuse it
    for v in (strict, lenient):
        assert not v.validate(record(where, SYBIL.public_key_hex, bare))
        assert not v.validate(record(where, PEER.public_key_hex, expired))
    assert strict.rejected == {f"{where}:not_admitted": 2, f"{where}:malformed": 1}


def test_a_withdrawal_is_an_aggregators_and_names_its_key():
    withdrawal = MembershipWithdrawal(
        task_id=TASK_ID, member_key=PEER.public_key_hex, reason="failed an audit", timestamp=now_ms(),
        until_ms=now_ms() + 3600_000,
    )  # fmt: skip
    wire = make_sealed(withdrawal, ADMITTING_AGGREGATOR).wire
    assert (
        open_withdrawal_value(TASK_ID, PEER.public_key_hex, wire, KEYS).record.member_key
        == PEER.public_key_hex
    )
    forged = make_sealed(withdrawal, SYBIL).wire  # a throw-away key withdrawing an honest peer
    with pytest.raises(RecordRejected) as refused:
        open_withdrawal_value(TASK_ID, PEER.public_key_hex, forged, KEYS)
    assert refused.value.reason is RejectReason.NOT_ADMITTED
    with pytest.raises(RecordRejected):
        open_withdrawal_value(TASK_ID, SYBIL.public_key_hex, wire, KEYS)  # filed under another key
    strict = MantaRecordValidator(TASK_ID, aggregator_keys=tuple(KEYS))
    assert strict.validate(record(withdrawals_key(TASK_ID), PEER.public_key_hex, wire))
    assert not strict.validate(record(withdrawals_key(TASK_ID), PEER.public_key_hex, forged))


def test_an_admission_request_reads_back_and_refuses_odd_payloads():
    request = AdmissionRequest(binding_wire(PEER), "invite-token-0123456789")
    assert AdmissionRequest.from_bytes(request.to_bytes()) == request
    for bad in (b"", b"{}", b'{"binding": "zz"}', b"[1]", b'{"binding": "00", "invite": 5}'):
        with pytest.raises(ValueError):
            AdmissionRequest.from_bytes(bad)
