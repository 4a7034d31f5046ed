"""Builders of valid records for tests (protocol and aggregator)."""

from __future__ import annotations

import hashlib
import time

from protocol.averaging_group import GroupMembership, group_membership
from protocol.identity import Identity
from protocol.records import ContributionReceipt, IdentityBinding
from protocol.sealing import make_sealed, seal
from protocol.task_spec import SwarmParams, TaskSpec

TASK = "cifar10-ofa-test"
_B58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"


def fake_peer_id(seed: bytes) -> str:
    """A syntactically valid libp2p-style base58 peer id ("Qm..." like an RSA peer's) derived from seed."""
    n = int.from_bytes(b"\x12\x20" + hashlib.sha256(seed).digest(), "big")
    out = ""
    while n:
        n, r = divmod(n, 58)
        out = _B58[r] + out
    return out


def peer_id_of(identity: Identity) -> str:
    return fake_peer_id(identity.public_key)


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


def binding_wire(identity: Identity, peer_id: str | None = None) -> bytes:
    return seal(
        IdentityBinding(
            peer_id=peer_id or peer_id_of(identity), public_key=identity.public_key_hex, timestamp=now_ms()
        ),
        identity,
    )


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
