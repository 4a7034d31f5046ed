"""Canonical JSON and the domain-separated messages that MANTA signs.

Every signature in MANTA covers ``domain_prefix(record_type, version) + canonical_json(value)``:

* :func:`canonical_json` is RFC 8785 (JSON Canonicalization Scheme) as implemented by the maintained
  ``rfc8785`` library: keys sorted, no whitespace, minimal string escapes, UTF-8. MANTA signs integers
  only (no floats: a value that must round-trip exactly is an integer in a stated unit, and a
  fractional setting such as a learning rate travels as a decimal string), and every integer must fit
  the I-JSON safe range (|n| <= 2**53 - 1) so that any JSON implementation reads it back exactly.
* :func:`domain_prefix` is one ASCII line naming the record type and its version, e.g.
  ``manta/receipt/v1\\n``. It makes a signature over one kind of record useless as a signature over
  another kind, or over the same kind in another version.
* :func:`signed_message` joins the two; :func:`split_signed_message` takes them apart again.
* :func:`ascii_canonical_json` is a faster encoder (the standard library's, keys sorted, no
  whitespace) that writes the same bytes as :func:`canonical_json` for values whose strings are
  printable ASCII and whose numbers are safe integers: for those, RFC 8785 output reduces to exactly
  that (only ``"`` and ``\\`` are escaped, both the same way). Every string field of a MANTA record
  is restricted to printable ASCII by its pattern, so receivers use it to check that a received
  record is canonical (``SealedRecord.is_canonical``, with the library as fallback); signers always
  use the library.

Canonical JSON never contains a raw newline (RFC 8785 escapes one inside a string as ``\\n``), so the
prefix line and the JSON line are unambiguous. The exact message bytes are what is signed and what
is stored: nobody re-serializes a record to check a signature.
"""

from __future__ import annotations

import json
import re
from typing import Any

import rfc8785

MAX_SAFE_INTEGER = 2**53 - 1
"""The largest integer every JSON implementation reads back exactly (I-JSON, RFC 7493)."""

_PREFIX_RE = re.compile(rb"manta/([a-z][a-z0-9_-]{0,31})/v([1-9][0-9]{0,5})")


class CanonicalError(ValueError):
    """A value that MANTA cannot sign: a float, an out-of-range integer, a non-string key, ..."""


def canonical_json(value: Any) -> bytes:
    """RFC 8785 canonical bytes of ``value`` (dicts, lists/tuples, str, int, bool, None; no floats)."""
    _reject_floats(value)
    try:
        return rfc8785.dumps(value)
    except rfc8785.CanonicalizationError as exc:  # IntegerDomainError, FloatDomainError, bad types
        raise CanonicalError(f"cannot canonicalize: {exc}") from exc


_ASCII_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def ascii_canonical_json(value: Any) -> bytes:
    """Fast encoder equal to :func:`canonical_json` on printable-ASCII strings and safe integers."""
    return _ASCII_ENCODER.encode(value).encode("ascii")


def _reject_floats(value: Any) -> None:
    if isinstance(value, float):
        raise CanonicalError(f"MANTA signs integers only, got the float {value!r}")
    if isinstance(value, dict):
        for item in value.values():
            _reject_floats(item)
    elif isinstance(value, list | tuple):
        for item in value:
            _reject_floats(item)


def domain_prefix(record_type: str, version: int) -> bytes:
    """The line that starts every signed message of this record type and version."""
    prefix = f"manta/{record_type}/v{version}".encode("ascii")
    if not _PREFIX_RE.fullmatch(prefix):
        raise ValueError(f"invalid record type or version: {record_type!r} v{version!r}")
    return prefix + b"\n"


def signed_message(record_type: str, version: int, canonical: bytes) -> bytes:
    """The exact bytes a signature covers: the domain prefix, then the canonical JSON."""
    if b"\n" in canonical:
        raise CanonicalError("canonical JSON never contains a raw newline")
    return domain_prefix(record_type, version) + canonical


def split_signed_message(message: bytes) -> tuple[str, int, bytes]:
    """``(record_type, version, canonical_json_bytes)`` of a signed message; ValueError if malformed."""
    head, sep, body = message.partition(b"\n")
    match = _PREFIX_RE.fullmatch(head)
    if not sep or match is None:
        raise ValueError("the message does not start with a manta/<type>/v<N> line")
    if b"\n" in body:
        raise ValueError("the message has more than two lines")
    return match.group(1).decode("ascii"), int(match.group(2)), body
