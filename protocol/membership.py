"""Who counts: membership certificates an aggregator of the task signs, and its withdrawals of them.

A key is a member of task ``T`` while it holds a :class:`MembershipCertificate` that one of the
task's aggregator keys (``TaskSpec.aggregator_keys``) sealed for that key and the peer id it runs
under, and that has not expired. Rosters, quorums, witnesses and progress corroboration count
members only, so keys made in bulk count for nothing unless an aggregator admitted each one (how it
admits is its policy: ``aggregator/admission.py``). A certificate lives at most
:data:`MAX_VALIDITY_MS`; peers renew theirs at half its life, so the swarm keeps working that long
while every aggregator is down. An aggregator withdraws a key's membership early (a failed audit, a
conviction) with a :class:`MembershipWithdrawal`, which readers apply until it expires.

Pure Python: :func:`certificate_problem` is the one check every reader and validator makes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import ClassVar

from pydantic import model_validator

from protocol.fields import Hex32, Int53, Name, PeerId, Text
from protocol.sealing import Sealed, SealedRecord

__all__ = [
    "AdmissionRequest",
    "CLOCK_SLACK_MS",
    "MAX_VALIDITY_MS",
    "MembershipCertificate",
    "MembershipWithdrawal",
    "certificate_problem",
]

MAX_VALIDITY_MS = 7 * 24 * 3600 * 1000  # the longest a certificate may live
MAX_INVITE_CHARS = 256
CLOCK_SLACK_MS = 60_000  # how far an issuer's clock may run ahead of a reader's


class MembershipCertificate(SealedRecord):
    """ "Key ``member_key``, running as ``peer_id``, is a member of ``task_id`` from ``issued_ms`` until
    ``expires_ms``", sealed by an aggregator key of the task."""

    RECORD_TYPE: ClassVar[str] = "membership"
    MAX_WIRE_BYTES: ClassVar[int] = 2048

    task_id: Name
    member_key: Hex32
    peer_id: PeerId
    serial: Int53  # the issuer's count of certificates issued: renewals carry new ones
    policy: Name  # how the key was admitted: open, invite or allow
    issued_ms: Int53
    expires_ms: Int53

    @model_validator(mode="after")
    def _lives_a_bounded_time(self) -> MembershipCertificate:
        if not self.issued_ms < self.expires_ms <= self.issued_ms + MAX_VALIDITY_MS:
            raise ValueError("a certificate lives after it is issued, and at most a week")
        return self


class MembershipWithdrawal(SealedRecord):
    """ "Key ``member_key`` is no member of ``task_id`` any more", sealed by an aggregator key of the
    task; readers apply it until ``until_ms`` (the last expiry of a certificate it was issued)."""

    RECORD_TYPE: ClassVar[str] = "withdrawal"
    MAX_WIRE_BYTES: ClassVar[int] = 1024

    task_id: Name
    member_key: Hex32
    reason: Text
    timestamp: Int53
    until_ms: Int53


def certificate_problem(
    certificate: Sealed[MembershipCertificate],
    task_id: str,
    aggregator_keys: tuple[str, ...] | frozenset[str],
    member_key: str,
    peer_id: str,
    now_ms: int,
) -> str | None:
    """Why ``certificate`` (opened: its signature holds) does not make ``member_key``, running as
    ``peer_id``, a member of ``task_id`` at ``now_ms``; None if it does."""
    cert = certificate.record
    if certificate.public_key.hex() not in aggregator_keys:
        return "its certificate is not signed by an aggregator of the task"
    if cert.task_id != task_id:
        return f"its certificate is for task {cert.task_id}"
    if cert.member_key != member_key or cert.peer_id != peer_id:
        return "its certificate is for another key or peer id"
    if now_ms >= cert.expires_ms:
        return "its certificate expired"
    if cert.issued_ms > now_ms + CLOCK_SLACK_MS:
        return "its certificate is issued in the future"
    return None


@dataclass(frozen=True)
class AdmissionRequest:
    """What a peer sends an aggregator's ``admit`` call: its sealed IdentityBinding (the key and the
    peer id the call comes from), and an invite token where the task's policy asks for one."""

    binding: bytes
    invite: str = ""

    def to_bytes(self) -> bytes:
        return json.dumps({"binding": self.binding.hex(), "invite": self.invite}, sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, payload: bytes) -> AdmissionRequest:
        """ValueError (one line) unless ``payload`` is such a request."""
        try:
            body = json.loads(bytes(payload).decode())
            binding, invite = bytes.fromhex(body["binding"]), body.get("invite", "")
        except (ValueError, KeyError, TypeError, AttributeError):
            raise ValueError("an admission request is JSON with a hex binding and an invite") from None
        if not isinstance(invite, str) or len(invite) > MAX_INVITE_CHARS or not invite.isprintable():
            raise ValueError(f"an invite is printable text of at most {MAX_INVITE_CHARS} characters")
        return cls(binding, invite)
