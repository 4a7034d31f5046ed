"""The one sealing (signing) format of every wire record, and the reasons a record is refused.

``seal(record, identity) -> bytes`` gives the wire form (``make_sealed`` gives it already opened, as a
:class:`Sealed`), which is also the ledger entry::

    manta/receipt/v2\\n                       <- domain prefix: record type and version
    {"cohort_id":...,"timestamp":...}\\n      <- RFC 8785 canonical JSON of the full record
    ed25519 <64 hex public key> <128 hex signature>

The signature covers the first two lines without the final newline (``Sealed.message``: the exact
signed bytes). The JSON must be *the* canonical encoding of the record it parses to (every field
present, nothing else), so one record has exactly one encoding and one leaf hash. Wire bytes are safe
as a hivemind DHT value.

``open_sealed(wire, expected_type) -> Sealed`` checks size, framing, type and version, schema,
canonical form, that the signer is a key the record allows, the signature, and that the peer id the
record names endorsed that key (:mod:`protocol.peer_keys`), in that order (cheapest first); it raises :class:`RecordRejected` with a :class:`RejectReason`. ``expected_type``
may be a tuple of record classes; only those are ever parsed. :func:`parse_sealed` skips the
canonical-form and signature checks (for re-reading data whose signatures were already checked).

Every sealed record type subclasses :class:`SealedRecord`; defining one registers it in
:data:`SEALED_TYPES`, which refuses a second class with the same type and version (one prefix, one
record type: a signature never reads as another record's).
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeVar

from pydantic import ValidationError

from protocol.canonical import ascii_canonical_json, canonical_json, domain_prefix, split_signed_message
from protocol.fields import StrictModel
from protocol.identity import Identity, verify_signature
from protocol.peer_keys import endorsement_holds

__all__ = [
    "MAX_WIRE_BYTES",
    "SEALED_TYPES",
    "RecordRejected",
    "RejectReason",
    "Sealed",
    "SealedRecord",
    "classify_validation_error",
    "make_sealed",
    "open_sealed",
    "parse_sealed",
    "seal",
]


class RejectReason(enum.StrEnum):
    """Why a record (or a contribution) was refused; the value is the stable code that is counted."""

    MALFORMED = "malformed"  # framing, JSON, missing field, value out of range or pattern
    UNKNOWN_FIELD = "unknown_field"
    WRONG_TYPE = "wrong_type"  # a field of the wrong JSON type
    OVERSIZE = "oversize"  # the wire form, a string or a list over its limit
    NON_CANONICAL = "non_canonical"  # valid JSON for the record, but not its RFC 8785 encoding
    WRONG_RECORD = "wrong_record"  # another record type than expected
    UNSUPPORTED_VERSION = "unsupported_version"  # the expected record type, in a version not read
    BAD_SIGNATURE = "bad_signature"  # signature invalid, or signed by a key the record does not name
    WRONG_TASK = "wrong_task"
    REPLAY = "replay"  # exactly this record was already accepted
    OUT_OF_ORDER = "out_of_order"  # a sequence number not above the key's last accepted one
    STALE_TIMESTAMP = "stale_timestamp"  # timestamp outside the accepted window (too old or ahead)
    NOT_ADMITTED = (
        "not_admitted"  # no live membership certificate of the task for the key (protocol.membership)
    )
    UNBOUND_PEER = "unbound_peer"  # no binding for the peer, or peer id / key / sender disagree
    ROUND_WINDOW = "round_window"  # a round the swarm is not in (too old, or ahead of it)
    GROUP_MISMATCH = "group_mismatch"  # the averaging group it names does not agree with the claim
    IMPLAUSIBLE = "implausible_samples"  # more samples than the peer's announced throughput allows
    NON_FINITE = "non_finite"  # gradient statistics missing or not finite
    AUDIT_FAILED = "audit_failed"  # a spot audit recomputed another gradient (revocation reason)
    MISPRICED = "mispriced"  # sub-networks or FLOPs other than the task derives for the round and cohort
    UNWITNESSED = "unwitnessed"  # no commit of another peer names the group the receipt claims
    EXCLUDED = "excluded"  # the key failed an audit and is excluded from the task
    # an audit could not get the start state: a revocation reason in ledgers written before 2026-11-27
    # (now such a receipt keeps its credit and its key owes an audit: aggregator/trust.py)
    AUDIT_UNAVAILABLE = "audit_unavailable"
    OUTLIER = "outlier"  # other peers' reducers named its values outliers: they were clipped or dropped
    EQUIVOCATED = "equivocated"  # as a reducer it signed two different proofs for one all-reduce


class RecordRejected(ValueError):
    """A record refused for ``reason``; ``detail`` says what exactly (one line)."""

    def __init__(self, reason: RejectReason, detail: str) -> None:
        super().__init__(f"{reason.value}: {detail}")
        self.reason = reason
        self.detail = detail


MAX_WIRE_BYTES = 64 * 1024  # the default limit on a sealed record's wire form

SEALED_TYPES: dict[tuple[str, int], type[SealedRecord]] = {}
"""Every sealed record class defined so far, by ``(RECORD_TYPE, VERSION)``."""


class SealedRecord(StrictModel):
    """A record type that is sealed (signed); subclasses set the type name, version and size limit.

    Defining a subclass registers it in :data:`SEALED_TYPES`; TypeError if another class already
    has its type and version.
    """

    RECORD_TYPE: ClassVar[str]
    VERSION: ClassVar[int] = 1
    MAX_WIRE_BYTES: ClassVar[int] = MAX_WIRE_BYTES

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        key = (cls.RECORD_TYPE, cls.VERSION)
        taken = SEALED_TYPES.setdefault(key, cls)
        if taken is not cls:
            raise TypeError(f"{cls.__name__}: {key[0]} v{key[1]} is already {taken.__qualname__}")

    @classmethod
    def prefix(cls) -> bytes:
        """The domain prefix line (with its newline) that starts this record type's signed message."""
        return domain_prefix(cls.RECORD_TYPE, cls.VERSION)

    def signer_allowed(self, public_key: bytes) -> bool:
        """Whether ``public_key`` may seal this record: the record's own ``public_key`` if it names one."""
        own = getattr(self, "public_key", None)
        return own is None or own == public_key.hex()

    def speaks_for_its_peer(self) -> bool:
        """Whether the libp2p key of the peer id the record names endorsed the record's key (records
        with an ``endorsement`` field; :mod:`protocol.peer_keys`); True for every other record."""
        endorsement = getattr(self, "endorsement", None)
        if endorsement is None:
            return True
        return endorsement_holds(getattr(self, "peer_id", ""), getattr(self, "public_key", ""), endorsement)

    def canonical(self) -> bytes:
        """The RFC 8785 encoding of the full record (what is signed)."""
        return canonical_json(self.model_dump(mode="json"))

    def is_canonical(self, body: bytes) -> bool:
        """Whether ``body`` is exactly :meth:`canonical` (fast path first; see protocol.canonical)."""
        fields = self.model_dump(mode="json")
        return ascii_canonical_json(fields) == body or canonical_json(fields) == body


R = TypeVar("R", bound=SealedRecord)

_TRAILER_RE = re.compile(rb"ed25519 ([0-9a-f]{64}) ([0-9a-f]{128})")


@dataclass(frozen=True, slots=True)
class Sealed(Generic[R]):
    """An opened sealed record.

    ``message`` is the exact signed bytes (prefix + canonical JSON); ``wire`` is ``message`` plus the
    signature line, the bytes a DHT value carries and the ledger stores as the entry.
    """

    record: R
    public_key: bytes
    signature: bytes
    message: bytes
    wire: bytes


def make_sealed(record: R, identity: Identity) -> Sealed[R]:
    """Seal ``record`` with ``identity`` and return the opened form.

    ValueError if the record does not allow ``identity``'s key, or the wire form is over its type's
    ``MAX_WIRE_BYTES``.
    """
    if not record.signer_allowed(identity.public_key):
        raise ValueError(f"{type(record).__name__} may not be sealed by key {identity.fingerprint}")
    if not record.speaks_for_its_peer():
        raise ValueError(f"{type(record).__name__}: its peer id did not endorse key {identity.fingerprint}")
    message = type(record).prefix() + record.canonical()
    signature = identity.sign(message)
    wire = message + b"\ned25519 " + identity.public_key.hex().encode() + b" " + signature.hex().encode()
    if len(wire) > type(record).MAX_WIRE_BYTES:
        raise ValueError(f"sealed {type(record).__name__} is {len(wire)} bytes, over its limit")
    return Sealed(record, identity.public_key, signature, message, wire)


def seal(record: SealedRecord, identity: Identity) -> bytes:
    """The wire bytes of ``record`` signed by ``identity`` (ValueError as :func:`make_sealed`)."""
    return make_sealed(record, identity).wire


def open_sealed(wire: bytes, expected_type: type[R] | tuple[type[SealedRecord], ...]) -> Sealed[R]:
    """Check and open a sealed record of one of the expected types; RecordRejected(reason, detail) if
    anything is wrong (see the module docstring for the order of the checks)."""
    return _open(wire, expected_type, check_signature=True)


def parse_sealed(wire: bytes, expected_type: type[R] | tuple[type[SealedRecord], ...]) -> Sealed[R]:
    """:func:`open_sealed` without the canonical-form and signature checks (for already verified data)."""
    return _open(wire, expected_type, check_signature=False)


def _open(wire: Any, expected_type: Any, check_signature: bool) -> Sealed[Any]:
    expected = expected_type if isinstance(expected_type, tuple) else (expected_type,)
    if not isinstance(wire, bytes | bytearray | memoryview):
        raise RecordRejected(RejectReason.MALFORMED, f"expected bytes, got {type(wire).__name__}")
    wire = bytes(wire)
    limit = max(cls.MAX_WIRE_BYTES for cls in expected)
    if len(wire) > limit:
        raise RecordRejected(RejectReason.OVERSIZE, f"{len(wire)} bytes, the limit is {limit}")
    message, newline, trailer = wire.rpartition(b"\n")
    try:
        if not newline:
            raise ValueError
        record_type, version, body = split_signed_message(message)
    except ValueError:
        raise RecordRejected(
            RejectReason.MALFORMED, "a sealed record is three lines: prefix, JSON, signature"
        ) from None
    cls = next((c for c in expected if (c.RECORD_TYPE, c.VERSION) == (record_type, version)), None)
    if cls is None:
        if any(c.RECORD_TYPE == record_type for c in expected):
            raise RecordRejected(
                RejectReason.UNSUPPORTED_VERSION, f"{record_type} v{version} is not supported"
            )
        names = "/".join(c.RECORD_TYPE for c in expected)
        raise RecordRejected(RejectReason.WRONG_RECORD, f"expected {names}, got {record_type!r}")
    if len(wire) > cls.MAX_WIRE_BYTES:
        raise RecordRejected(
            RejectReason.OVERSIZE, f"{len(wire)} bytes, the {cls.RECORD_TYPE} limit is {cls.MAX_WIRE_BYTES}"
        )
    sig = _TRAILER_RE.fullmatch(trailer)
    if sig is None:
        raise RecordRejected(RejectReason.MALFORMED, "malformed signature line")
    try:
        record = cls.model_validate_json(body, strict=True)
    except ValidationError as exc:
        reason, detail = classify_validation_error(exc)
        raise RecordRejected(reason, detail) from None
    if check_signature and not record.is_canonical(body):
        raise RecordRejected(RejectReason.NON_CANONICAL, "the JSON is not the record's RFC 8785 encoding")
    public_key, signature = bytes.fromhex(sig.group(1).decode()), bytes.fromhex(sig.group(2).decode())
    if not record.signer_allowed(public_key):
        raise RecordRejected(RejectReason.BAD_SIGNATURE, "sealed by a key the record does not name")
    if check_signature and not verify_signature(public_key, message, signature):
        raise RecordRejected(RejectReason.BAD_SIGNATURE, "the signature does not verify")
    if check_signature and not record.speaks_for_its_peer():
        raise RecordRejected(
            RejectReason.UNBOUND_PEER, "the libp2p key of the peer id it names did not endorse its key"
        )
    return Sealed(record, public_key, signature, message, wire)


_TYPE_ERRORS = re.compile(r".*_type$|^is_instance_of$")


def classify_validation_error(exc: ValidationError) -> tuple[RejectReason, str]:
    """Map a pydantic error to the most specific reason code, and a one-line detail.

    Unknown fields first, then oversize strings and lists, then fields of the wrong JSON type; anything
    else (missing field, value out of range or pattern, not a JSON object, not JSON) is malformed.
    """
    errors = exc.errors(include_url=False, include_input=False)

    def describe(err: dict[str, Any]) -> str:
        where = ".".join(str(part) for part in err["loc"]) or "record"
        return f"{where}: {err['msg']}"

    for reason, matches in (
        (RejectReason.UNKNOWN_FIELD, lambda e: e["type"] == "extra_forbidden"),
        (RejectReason.OVERSIZE, lambda e: e["type"] in {"string_too_long", "too_long"}),
        (RejectReason.WRONG_TYPE, lambda e: bool(e["loc"]) and bool(_TYPE_ERRORS.match(e["type"]))),
    ):
        for err in errors:
            if matches(err):
                return reason, describe(err)
    return RejectReason.MALFORMED, describe(errors[0])
