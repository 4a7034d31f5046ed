"""Which DHT keys a MANTA task uses, and the validator that every node of the task registers.

A hivemind DHT accepts any record unless its nodes run validators, and validation is local: a node
without them stores and serves whatever it is given. So the aggregator *and* every peer register
:class:`MantaRecordValidator` for their task, and a forged or malformed MANTA record is dropped by
every node it reaches, both when someone asks it to store the record and when it arrives in a
lookup.

Keys of task ``T`` (every value is a dictionary keyed by the signer's Ed25519 public key in hex, so
nobody can overwrite another party's entry — the subkey must name the key that sealed the value):

- ``manta_T_task``:  a sealed :class:`~protocol.task_spec.TaskSpec` for task ``T`` from one of its aggregators;
- ``manta_T_peers``: ``[announcement, binding, certificate]``: a sealed
  :class:`~protocol.records.PeerAnnouncement` for ``T``, the sealed
  :class:`~protocol.records.IdentityBinding` of the same key and peer id, and the key's
  :class:`~protocol.membership.MembershipCertificate` (an entry without a live one is refused).
- ``manta_T_withdrawn``: subkey ``<member key>``, a :class:`~protocol.membership.MembershipWithdrawal`
  an aggregator of ``T`` sealed.
- ``manta_T_commits_B`` (B = attempt mod :data:`COMMIT_BUCKETS`): subkey ``<attempt>/<public key>``, a
  sealed :class:`~protocol.records.RoundCommit` of that attempt by that key. Entries expire within
  minutes; spread over buckets, a read of one attempt's reports fetches about that attempt's alone
  instead of every attempt's the TTL keeps.
- ``manta_T_progress``: subkey ``<public key>``, the sealed :class:`~protocol.records.PeerProgress` of that
  key (overwritten about once a second; expires within a minute of the peer leaving).
- ``manta_T_aggregators``: subkey ``<public key>``, the sealed :class:`~protocol.records.IdentityBinding` of an
  aggregator's key to its libp2p peer id (peers deliver receipts to that peer id; they trust only keys
  the TaskSpec lists).
- ``manta_T_ledger``: subkey ``<public key>``, the latest signed checkpoint note of that aggregator's ledger.
- ``manta_T_anchor``: subkey ``<public key>``, the sealed :class:`~protocol.records.StateAnchor` of the
  state that aggregator's newest checkpoint holds (what a peer may load without a quorum's word).
- ``manta_T_convictions``: subkey ``<reducer key>/<public key>``, a sealed
  :class:`~protocol.records.ReducerConviction` that key posted: two different proofs digests the
  reducer key signed for one all-reduce (the validator checks both signatures). Long-lived.
- ``manta_tasks`` (one key for the whole DHT, so a volunteer can join without knowing the task id):
  subkey ``T``, value the sealed TaskSpec of ``T``.

- hivemind's group keys (``<task id>_<averager>.0b<bits>``; the validator sees only their ids): subkey
  ``<peer id>/<public key>``, a sealed :class:`~protocol.declarations.AveragingDeclaration` that names the
  key it is stored under. hivemind's own unsigned declarations (a bare boolean under a peer id) are
  refused: every MANTA node declares signed (``hivemind_adapter.group_keys``).

Other keys that are not MANTA's (hivemind's state-sharing keys) pass through untouched.

Every family has a lifetime (:mod:`protocol.record_lifetimes`): a copy stored to expire later than
its record allows, or signed ahead of the node's clock, is refused like a forgery.

This module is pure Python: hivemind calls ``validate``, ``sign_value``, ``strip_value``,
``merge_with`` and ``priority`` by name, so the validator need not inherit from hivemind's base class,
and a DHT key's id is computed here the way hivemind computes it (SHA-1 of the key's msgpack
encoding; a test pins this against hivemind's own ``DHTID``).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import msgpack

from protocol.cohort_directory import DirectoryHeader
from protocol.declarations import open_declaration_value
from protocol.ledger_checkpoint import Checkpoint
from protocol.membership import (
    MAX_VALIDITY_MS,
    MembershipCertificate,
    MembershipWithdrawal,
    certificate_problem,
)
from protocol.record_lifetimes import (
    ANNOUNCE_TTL,
    COMMIT_MAX_TTL,
    CONVICTION_TTL,
    DIRECTORY_TTL,
    PROGRESS_TTL,
    PUBLISHED_TTL,
    TASK_TTL,
    Lifetime,
    expiry_error,
    signed_seconds,
)
from protocol.records import (
    IdentityBinding,
    PeerAnnouncement,
    PeerProgress,
    ReducerConviction,
    RoundCommit,
    StateAnchor,
)
from protocol.sealing import RecordRejected, RejectReason, Sealed, open_sealed
from protocol.task_spec import TaskSpec
from protocol.verified_records import DEFAULT_CAPACITY, VerifiedRecords

TASKS_INDEX_KEY = "manta_tasks"  # subkey: task id, value: that task's sealed TaskSpec (for discovery)


def task_key(task_id: str) -> str:
    return f"manta_{task_id}_task"


def peers_key(task_id: str) -> str:
    return f"manta_{task_id}_peers"


def withdrawals_key(task_id: str) -> str:
    return f"manta_{task_id}_withdrawn"


COMMIT_BUCKETS = 16  # keys the commit board is spread over; more than the attempts its TTL keeps


def commits_key(task_id: str, attempt: int) -> str:
    """The key of the commit-board bucket that holds ``attempt``'s reports."""
    return f"manta_{task_id}_commits_{attempt % COMMIT_BUCKETS}"


def outer_board_id(task_id: str) -> str:
    """The name the commit board of a task's outer steps (``sync = "outer"``) goes by: its reports
    are RoundCommits for this name, under ``manta_<this>_commits_B``, and their attempts are outer
    step numbers, apart from the rounds' attempts."""
    return f"{task_id}.outer"


def progress_key(task_id: str) -> str:
    return f"manta_{task_id}_progress"


def aggregators_key(task_id: str) -> str:
    return f"manta_{task_id}_aggregators"


def ledger_key(task_id: str) -> str:
    return f"manta_{task_id}_ledger"


def anchor_key(task_id: str) -> str:
    return f"manta_{task_id}_anchor"


def directory_key(task_id: str) -> str:
    """Where the task's aggregators publish their cohort directory headers
    (:class:`protocol.cohort_directory.DirectoryHeader`), one entry per aggregator key."""
    return f"manta_{task_id}_directory"


def convictions_key(task_id: str) -> str:
    """Where peers post the evidence that a reducer equivocated (:class:`protocol.records.ReducerConviction`)."""
    return f"manta_{task_id}_convictions"


def conviction_subkey(reducer_key_hex: str, public_key_hex: str) -> str:
    """One entry per convicted key and poster: a poster cannot overwrite another's evidence."""
    return f"{reducer_key_hex}/{public_key_hex}"


def commit_subkey(attempt: int, public_key_hex: str) -> str:
    return f"{attempt}/{public_key_hex}"


def dht_key_id(key: str) -> bytes:
    """The 20-byte id hivemind's DHT stores ``key`` under."""
    return hashlib.sha1(msgpack.packb(key, use_bin_type=True)).digest()


def open_task_value(task_id: str, subkey: Any, value: Any) -> Sealed[TaskSpec]:
    """Check one entry of ``manta_T_task``; RecordRejected if it is not a valid TaskSpec for ``task_id``."""
    sealed = open_sealed(_as_bytes(value), TaskSpec)
    _check_owner(sealed, subkey)
    if sealed.record.task_id != task_id:
        raise RecordRejected(RejectReason.WRONG_TASK, f"task {sealed.record.task_id!r} under {task_id!r}")
    return sealed


def open_index_value(subkey: Any, value: Any) -> Sealed[TaskSpec]:
    """Check one entry of the task index: a sealed TaskSpec whose task id is the subkey."""
    sealed = open_sealed(_as_bytes(value), TaskSpec)
    if subkey != sealed.record.task_id:
        raise RecordRejected(
            RejectReason.WRONG_TASK, f"index entry {subkey!r} holds task {sealed.record.task_id!r}"
        )
    return sealed


def open_commit_value(
    task_id: str, subkey: Any, value: Any, bucket: int | None = None
) -> Sealed[RoundCommit]:
    """Check one entry of ``manta_T_commits_B``: a RoundCommit for ``task_id`` under ``<attempt>/<its
    key>``, whose attempt belongs in bucket ``bucket`` (if given; a report in another bucket is never
    read where it belongs, so it is refused rather than stored)."""
    sealed = open_sealed(_as_bytes(value), RoundCommit)
    record = sealed.record
    if record.task_id != task_id:
        raise RecordRejected(RejectReason.WRONG_TASK, f"commit for {record.task_id!r}")
    if subkey != commit_subkey(record.attempt, sealed.public_key.hex()):
        raise RecordRejected(RejectReason.BAD_SIGNATURE, "the subkey must be <attempt>/<signer's public key>")
    if bucket is not None and record.attempt % COMMIT_BUCKETS != bucket:
        raise RecordRejected(
            RejectReason.MALFORMED,
            f"attempt {record.attempt} belongs in commit bucket {record.attempt % COMMIT_BUCKETS}",
        )
    return sealed


def open_progress_value(task_id: str, subkey: Any, value: Any) -> Sealed[PeerProgress]:
    """Check one entry of ``manta_T_progress``: a PeerProgress for ``task_id`` under its signer's key."""
    sealed = open_sealed(_as_bytes(value), PeerProgress)
    _check_owner(sealed, subkey)
    if sealed.record.task_id != task_id:
        raise RecordRejected(RejectReason.WRONG_TASK, f"progress for {sealed.record.task_id!r}")
    return sealed


def open_anchor_value(task_id: str, subkey: Any, value: Any) -> Sealed[StateAnchor]:
    """Check one entry of ``manta_T_anchor``: a StateAnchor for ``task_id`` sealed by the subkey's key
    (whether that key is one of the task's aggregators is the reader's to check)."""
    sealed = open_sealed(_as_bytes(value), StateAnchor)
    _check_owner(sealed, subkey)
    if sealed.record.task_id != task_id:
        raise RecordRejected(RejectReason.WRONG_TASK, f"anchor for {sealed.record.task_id!r}")
    return sealed


def open_directory_value(
    task_id: str, subkey: Any, value: Any, aggregator_keys: frozenset[str] | None = None
) -> Sealed[DirectoryHeader]:
    """Check one entry of ``manta_T_directory``: a DirectoryHeader for ``task_id`` sealed by the
    subkey's key, an aggregator key of the task (any key, where ``aggregator_keys`` is None)."""
    sealed = open_sealed(_as_bytes(value), DirectoryHeader)
    _check_owner(sealed, subkey)
    if sealed.record.task_id != task_id:
        raise RecordRejected(RejectReason.WRONG_TASK, f"directory for {sealed.record.task_id!r}")
    if aggregator_keys is not None and sealed.public_key.hex() not in aggregator_keys:
        raise RecordRejected(RejectReason.NOT_ADMITTED, "a directory not signed by an aggregator of the task")
    return sealed


def open_conviction_value(task_id: str, subkey: Any, value: Any) -> Sealed[ReducerConviction]:
    """Check one entry of ``manta_T_convictions``: a ReducerConviction for ``task_id`` under
    ``<reducer key>/<poster key>``, sealed by the poster, whose two attestations the reducer's key
    signed (evidence that does not hold is refused before any node stores it)."""
    sealed = open_sealed(_as_bytes(value), ReducerConviction)
    record = sealed.record
    if record.task_id != task_id:
        raise RecordRejected(RejectReason.WRONG_TASK, f"conviction for {record.task_id!r}")
    if subkey != conviction_subkey(record.reducer_key, sealed.public_key.hex()):
        raise RecordRejected(RejectReason.BAD_SIGNATURE, "the subkey must be <reducer key>/<poster's key>")
    if not record.signatures_hold():
        raise RecordRejected(RejectReason.BAD_SIGNATURE, "the attestations are not signed by the reducer key")
    return sealed


def open_aggregator_value(subkey: Any, value: Any) -> Sealed[IdentityBinding]:
    """Check one entry of ``manta_T_aggregators``: an IdentityBinding sealed by the subkey's key."""
    sealed = open_sealed(_as_bytes(value), IdentityBinding)
    _check_owner(sealed, subkey)
    return sealed


def open_ledger_value(subkey: Any, value: Any) -> Checkpoint:
    """Check one entry of ``manta_T_ledger``: a checkpoint note signed by the subkey's key."""
    try:
        key = bytes.fromhex(subkey) if isinstance(subkey, str) else b""
        return Checkpoint.from_note(_as_bytes(value).decode("utf-8"), key)
    except (ValueError, UnicodeDecodeError) as e:
        raise RecordRejected(
            RejectReason.BAD_SIGNATURE, f"not a checkpoint signed by the subkey: {e}"
        ) from None


@dataclass(frozen=True)
class PeerEntry:
    """One opened entry of ``manta_T_peers``."""

    announcement: Sealed[PeerAnnouncement]
    binding: Sealed[IdentityBinding]
    certificate: Sealed[MembershipCertificate]


def open_peer_value(
    task_id: str, subkey: Any, value: Any, aggregator_keys: frozenset[str] | None = None
) -> PeerEntry:
    """Check one entry of ``manta_T_peers``: an announcement for ``task_id``, the matching binding and
    a live membership certificate for the same key and peer id. ``aggregator_keys``: the task's (its
    signer must be one of them); None where they are not known (a node that only stores)."""
    if not isinstance(value, list | tuple) or len(value) != 3:
        raise RecordRejected(RejectReason.MALFORMED, "a peer entry is [announcement, binding, certificate]")
    announcement = open_sealed(_as_bytes(value[0]), PeerAnnouncement)
    binding = open_sealed(_as_bytes(value[1]), IdentityBinding)
    certificate = open_sealed(_as_bytes(value[2]), MembershipCertificate)
    _check_owner(announcement, subkey)
    a = announcement.record
    if binding.public_key != announcement.public_key or binding.record.peer_id != a.peer_id:
        raise RecordRejected(RejectReason.UNBOUND_PEER, "the binding names another key or peer id")
    if a.task_id != task_id:
        raise RecordRejected(RejectReason.WRONG_TASK, f"announcement for {a.task_id!r}")
    signers = aggregator_keys if aggregator_keys is not None else {certificate.public_key.hex()}
    problem = certificate_problem(
        certificate, task_id, signers, a.public_key, a.peer_id, int(time.time() * 1000)
    )
    if problem is not None:
        raise RecordRejected(RejectReason.NOT_ADMITTED, problem)
    return PeerEntry(announcement, binding, certificate)


def open_withdrawal_value(
    task_id: str, subkey: Any, value: Any, aggregator_keys: frozenset[str] | None = None
) -> Sealed[MembershipWithdrawal]:
    """Check one entry of ``manta_T_withdrawn``: a withdrawal for ``task_id`` of the subkey's key,
    sealed by an aggregator key of the task (any key, where ``aggregator_keys`` is None)."""
    sealed = open_sealed(_as_bytes(value), MembershipWithdrawal)
    if sealed.record.task_id != task_id:
        raise RecordRejected(RejectReason.WRONG_TASK, f"withdrawal for {sealed.record.task_id!r}")
    if subkey != sealed.record.member_key:
        raise RecordRejected(RejectReason.MALFORMED, "the subkey must be the withdrawn key")
    if aggregator_keys is not None and sealed.public_key.hex() not in aggregator_keys:
        raise RecordRejected(
            RejectReason.NOT_ADMITTED, "a withdrawal not signed by an aggregator of the task"
        )
    return sealed


class MantaRecordValidator:
    """hivemind record validator (duck-typed) for the MANTA keys of one task.

    hivemind validates every entry of every lookup's answer, however often the same entries come
    back, so verdicts are kept per exact (key, subkey, value) bytes (``cache_capacity`` of them, least
    recently used out first): a repeated entry costs a dictionary lookup, new bytes are checked.

    ``rejected`` counts what it dropped, by key name and reason, so an operator can see attacks.
    """

    def __init__(
        self, task_id: str, cache_capacity: int = DEFAULT_CAPACITY, aggregator_keys: tuple[str, ...] = ()
    ):
        """``aggregator_keys``: the task's, where known (membership certificates and withdrawals must be
        sealed by one of them); empty: any signer, the rest still checked."""
        self.task_id, self.cache_capacity, self.aggregator_keys = (
            task_id,
            cache_capacity,
            tuple(aggregator_keys),
        )
        keys = frozenset(aggregator_keys) if aggregator_keys else None
        signed = partial(Lifetime, signed_at=signed_seconds)
        checks: dict[str, tuple[Callable[[Any, Any], object], Lifetime]] = {
            task_key(task_id): (lambda sk, v: open_task_value(task_id, sk, v), Lifetime(TASK_TTL)),
            peers_key(task_id): (
                lambda sk, v: open_peer_value(task_id, sk, v, keys),
                Lifetime(ANNOUNCE_TTL, lambda opened: signed_seconds(opened.announcement)),
            ),
            withdrawals_key(task_id): (
                lambda sk, v: open_withdrawal_value(task_id, sk, v, keys),
                signed(MAX_VALIDITY_MS / 1000),
            ),
            progress_key(task_id): (lambda sk, v: open_progress_value(task_id, sk, v), signed(PROGRESS_TTL)),
            aggregators_key(task_id): (open_aggregator_value, signed(PUBLISHED_TTL)),
            ledger_key(task_id): (open_ledger_value, Lifetime(PUBLISHED_TTL)),
            anchor_key(task_id): (lambda sk, v: open_anchor_value(task_id, sk, v), signed(PUBLISHED_TTL)),
            directory_key(task_id): (
                lambda sk, v: open_directory_value(task_id, sk, v, keys),
                signed(DIRECTORY_TTL),
            ),
            convictions_key(task_id): (
                lambda sk, v: open_conviction_value(task_id, sk, v),
                signed(CONVICTION_TTL),
            ),
            TASKS_INDEX_KEY: (open_index_value, Lifetime(TASK_TTL)),
        }
        for board in (task_id, outer_board_id(task_id)):
            for bucket in range(COMMIT_BUCKETS):
                checks[commits_key(board, bucket)] = (
                    partial(open_commit_value, board, bucket=bucket),
                    signed(COMMIT_MAX_TTL),
                )
        self._checks = {dht_key_id(name): (name, check, life) for name, (check, life) in checks.items()}
        self._verdicts = VerifiedRecords(self._check_wire, cache_capacity)
        self.rejected: dict[str, int] = {}  # written by validate() only, on the DHT's event loop

    def _check_wire(self, where: tuple[bytes, bytes], value: bytes) -> object:
        """Decode and check one entry; ``where`` is (key id, packed subkey)."""
        key_id, packed_subkey = where
        known = self._checks.get(key_id)
        check = known[1] if known is not None else partial(open_declaration_value, self.task_id, key_id)
        try:
            subkey = msgpack.unpackb(packed_subkey, raw=False) if packed_subkey else None
            return check(subkey, msgpack.unpackb(value, raw=False, strict_map_key=False))
        except RecordRejected:
            raise
        except Exception as e:  # undecodable or oddly shaped bytes are as invalid as a bad signature
            raise RecordRejected(RejectReason.MALFORMED, f"undecodable: {type(e).__name__}") from None

    def validate(self, record: Any) -> bool:
        key_id = bytes(record.key)
        entry = self._checks.get(key_id)
        if entry is None:
            kind = _unnamed_kind(bytes(record.subkey or b""), bytes(record.value))
            if kind == "other":
                return True  # not a MANTA key of this task
            if kind == "unsigned_declaration":
                self.rejected["group_key:unsigned"] = self.rejected.get("group_key:unsigned", 0) + 1
                return False
            entry = ("group_key", None, None)
        try:
            opened = self._verdicts.open((key_id, bytes(record.subkey or b"")), bytes(record.value))
            lifetime = entry[2]
            if lifetime is not None and expiry_error(lifetime, opened, record.expiration_time, time.time()):
                raise RecordRejected(RejectReason.STALE_TIMESTAMP, "outlives its record")
            return True
        except RecordRejected as e:
            label = f"{entry[0]}:{e.reason}"
        self.rejected[label] = self.rejected.get(label, 0) + 1
        return False

    @property
    def counts(self) -> tuple[int, int]:
        """(entries checked, entries answered from the verdict cache) so far."""
        return self._verdicts.counts

    def sign_value(self, record: Any) -> bytes:
        return record.value  # values are sealed by their authors before they are stored

    def strip_value(self, record: Any) -> bytes:
        return record.value

    @property
    def priority(self) -> int:
        return 5

    def merge_with(self, other: Any) -> bool:
        return False

    # Pickling: the DHT process receives validators over a pipe; rebuild the closures there.
    def __reduce__(self):
        return (MantaRecordValidator, (self.task_id, self.cache_capacity, self.aggregator_keys))


def _unnamed_kind(packed_subkey: bytes, packed_value: bytes) -> str:
    """What an entry under a key id the validator cannot name is: ``"declaration"`` (a MANTA averaging
    declaration: a ``<peer id>/<key>`` subkey), ``"unsigned_declaration"`` (hivemind's: a bare boolean)
    or ``"other"`` (hivemind's state-sharing priorities, say)."""
    try:
        value = msgpack.unpackb(packed_value, raw=False) if packed_value else None
        subkey = msgpack.unpackb(packed_subkey, raw=False) if packed_subkey else None
    except Exception:
        return "other"
    if isinstance(value, bool):
        return "unsigned_declaration"
    if isinstance(subkey, str) and "/" in subkey and isinstance(value, bytes):
        return "declaration"
    return "other"


def _check_owner(sealed: Sealed[Any], subkey: Any) -> None:
    if subkey != sealed.public_key.hex():
        raise RecordRejected(RejectReason.BAD_SIGNATURE, "the subkey must be the signer's public key")


def _as_bytes(value: Any) -> bytes:
    if not isinstance(value, bytes | bytearray):
        raise RecordRejected(RejectReason.MALFORMED, f"expected sealed bytes, got {type(value).__name__}")
    return bytes(value)
