"""Builders of valid records for tests (protocol and aggregator)."""

from __future__ import annotations

import hashlib
import time

from protocol.averaging_group import GroupMembership, group_membership
from protocol.identity import Identity
from protocol.membership import MembershipCertificate
from protocol.peer_keys import Libp2pKey, Speaker
from protocol.records import ContributionReceipt, IdentityBinding
from protocol.sealing import make_sealed, seal
from protocol.task_spec import SwarmParams, TaskSpec

TASK = "cifar10-ofa-test"
# signs the membership certificates of test peers wherever the test does not name its own aggregator
ADMITTING_AGGREGATOR = Identity.from_seed(b"the aggregator that admits tests")
_B58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"


def fake_peer_id(seed: bytes) -> str:
    """A syntactically valid libp2p-style base58 peer id ("Qm..." like an RSA peer's) derived from seed."""
    n = int.from_bytes(b"\x12\x20" + hashlib.sha256(seed).digest(), "big")
    out = ""
    while n:
        n, r = divmod(n, 58)
        out = _B58[r] + out
    return out


def libp2p_key_of(identity: Identity) -> Libp2pKey:
    """The libp2p key a test peer with ``identity`` runs under (derived from it: one per identity)."""
    return Libp2pKey.from_seed(hashlib.sha256(b"test libp2p key" + identity.public_key).digest())


def speaker_of(identity: Identity) -> Speaker:
    """``identity`` under its test peer id (:func:`libp2p_key_of`), endorsed."""
    return Speaker.of(identity, libp2p_key_of(identity))


def peer_id_of(identity: Identity) -> str:
    return libp2p_key_of(identity).peer_id


def endorsement_of(identity: Identity) -> str:
    return speaker_of(identity).endorsement


def now_ms() -> int:
    return int(time.time() * 1000)


def group_fields(membership: GroupMembership) -> dict:
    """A receipt's group fields from one member's view of its group."""
    return dict(
        group_root=membership.root,
        group_size=membership.size,
        group_index=membership.index,
        group_proof=membership.proof,
    )


def receipt(identity: Identity, seq: int, **overrides) -> ContributionReceipt:
    """A valid receipt; its group is this peer and one other member, unless ``overrides`` say otherwise
    (a changed ``samples`` keeps the group as it was: the proof then no longer matches it)."""
    peer = peer_id_of(identity)
    group = group_membership([(peer, 256), (fake_peer_id(b"other-member"), 128)], peer)
    fields = dict(
        task_id=TASK,
        round=seq,
        peer_id=peer,
        public_key=identity.public_key_hex,
        seq=seq,
        cohort_id="host-a",
        subnet_hashes=(hashlib.sha256(b"subnet-k7-d4-w6").hexdigest(),),
        samples=256,
        flops_per_sample=3 * 40_000_000,
        grad_commitment=hashlib.sha256(b"grad%d" % seq).hexdigest(),
        state_digest=hashlib.sha256(b"state%d" % seq).hexdigest(),
        group_id="0f" * 16,
        **group_fields(group),
        timestamp=now_ms(),
    )
    fields.update(overrides)
    return ContributionReceipt(**fields)


def sealed_receipt(identity: Identity, seq: int, **overrides):
    return make_sealed(receipt(identity, seq, **overrides), identity)


def receipt_wire(identity: Identity, seq: int, **overrides) -> bytes:
    return seal(receipt(identity, seq, **overrides), identity)


def binding_wire(identity: Identity, libp2p_key: Libp2pKey | None = None) -> bytes:
    """``identity``'s binding to its test peer id, or to the peer id of ``libp2p_key``."""
    return speaker_binding_wire(Speaker.of(identity, libp2p_key or libp2p_key_of(identity)))


def speaker_binding_wire(speaker: Speaker) -> bytes:
    """The sealed binding of what ``speaker`` signs as."""
    binding = IdentityBinding(
        peer_id=speaker.peer_id,
        public_key=speaker.public_key_hex,
        endorsement=speaker.endorsement,
        timestamp=now_ms(),
    )
    return seal(binding, speaker.identity)


def seal_unchecked(record, identity: Identity) -> bytes:
    """``record`` sealed by ``identity`` without :func:`~protocol.sealing.seal`'s own checks: what an
    attacker's software sends (build ``record`` with ``model_construct`` to skip the schema too)."""
    message = type(record).prefix() + record.canonical()
    signature = identity.sign(message).hex().encode()
    return message + b"\ned25519 " + identity.public_key_hex.encode() + b" " + signature


def certificate_wire(
    identity: Identity,
    aggregator: Identity = ADMITTING_AGGREGATOR,
    task_id: str = TASK,
    peer_id: str | None = None,
    lives_ms: int = 3600 * 1000,
    issued_ms: int | None = None,
) -> bytes:
    """A membership certificate of ``identity`` (under its test peer id, or ``peer_id``) in ``task_id``,
    sealed by ``aggregator``."""
    issued = now_ms() if issued_ms is None else issued_ms
    certificate = MembershipCertificate(
        task_id=task_id, member_key=identity.public_key_hex, peer_id=peer_id or peer_id_of(identity),
        serial=1, policy="open", issued_ms=issued, expires_ms=issued + lives_ms,
    )  # fmt: skip
    return seal(certificate, aggregator)


def resign(wire: bytes, identity: Identity, new_body: bytes) -> bytes:
    """Replace a sealed record's JSON line by ``new_body`` and sign it properly (tests of schema checks)."""
    head = wire.split(b"\n")[0]
    message = head + b"\n" + new_body
    return (
        message
        + b"\ned25519 "
        + identity.public_key_hex.encode()
        + b" "
        + identity.sign(message).hex().encode()
    )


def task_spec(aggregator: Identity, task_id: str = TASK, task: str = "digits") -> TaskSpec:
    """A small valid TaskSpec whose only aggregator is ``aggregator``."""
    params = SwarmParams(
        target_samples_per_round=512,
        subnets_per_step=4,
        batch_size=32,
        max_group_size=4,
        round_timeout_ms=60_000,
        receipt_window_ms=600_000,
        learning_rate="0.1",
    )
    return TaskSpec(
        task_id=task_id,
        task=task,
        mode="data",
        seed=7,
        params=params,
        aggregator_keys=(aggregator.public_key_hex,),
        ledger_origin=f"manta/{task_id}",
        timestamp=now_ms(),
    )
