"""Signed averaging declarations: how a MANTA peer says "I am looking for a group under this key".

hivemind's matchmaking finds partners through the DHT: each averager stores, under its group key,
subkey = its libp2p peer id and value = a bare boolean (looking for a group or not), with the expiry
that orders leaders. Nothing in that entry is signed, so anyone can

- declare peer ids that do not exist, with early expiries: every peer tries them first as leaders and
  waits out a request timeout for each (a handful per key stalls a stage past its deadline);
- declare an honest peer *not* looking (hivemind withdraws with a slightly later expiry, which
  overwrites), so nobody finds it.

A DHT validator cannot tell a group key from any other: it sees the key's id (the SHA-1 of its name),
never the name. So the declaration carries the name itself, signed by the declarer's MANTA key
together with the peer id it speaks as; the validator checks that the name hashes to the record's key
id, belongs to the task, and that the subkey is ``<peer id>/<public key>`` of the signer (so one key's
entry can never overwrite another's). Which keys may speak for which peer ids is the roster's to say:
readers (``hivemind_adapter.group_keys``) keep only declarations whose key the roster pairs with the
peer id. Every MANTA node declares in this form, so the validator refuses hivemind's bare booleans.
"""

from __future__ import annotations

import hashlib
from typing import Any

import msgpack

from protocol.records import AveragingDeclaration
from protocol.sealing import RecordRejected, RejectReason, Sealed, open_sealed


def declaration_subkey(peer_id: str, public_key_hex: str) -> str:
    """The DHT subkey a declaration is stored under: one per (peer id, key), so no key can overwrite
    the entry of another, whatever peer id it names."""
    return f"{peer_id}/{public_key_hex}"


def belongs_to_task(group_key: str, task_id: str) -> bool:
    """Whether ``group_key`` is one of ``task_id``'s averaging keys (every MANTA run id of a task is
    the task id or starts with it and an underscore)."""
    return group_key.startswith(f"{task_id}_") or group_key.startswith(f"{task_id}.0b")


def _key_id(name: str) -> bytes:
    # as hivemind's DHTID and protocol.dht_schema.dht_key_id compute it (not imported: that module imports this one)
    return hashlib.sha1(msgpack.packb(name, use_bin_type=True)).digest()


def open_declaration_value(
    task_id: str, key_id: bytes, subkey: Any, value: Any
) -> Sealed[AveragingDeclaration]:
    """Check one declaration stored under the DHT key id ``key_id``; RecordRejected says why it fails."""
    if not isinstance(value, bytes | bytearray):
        raise RecordRejected(
            RejectReason.MALFORMED, f"a declaration is sealed bytes, not {type(value).__name__}"
        )
    sealed = open_sealed(bytes(value), AveragingDeclaration)
    record = sealed.record
    if record.task_id != task_id or not belongs_to_task(record.group_key, task_id):
        raise RecordRejected(
            RejectReason.WRONG_TASK, f"declaration for {record.task_id!r} under {record.group_key!r}"
        )
    if _key_id(record.group_key) != key_id:
        raise RecordRejected(
            RejectReason.MALFORMED, "the declared group key is not the key it is stored under"
        )
    if subkey != declaration_subkey(record.peer_id, sealed.public_key.hex()):
        raise RecordRejected(
            RejectReason.UNBOUND_PEER, "the subkey must be the declared peer id and the signer's key"
        )
    return sealed
