"""C2SP signed notes (c2sp.org/signed-note) and transparency-log checkpoints (c2sp.org/tlog-checkpoint).

A signed note is a UTF-8 text ending in a newline, a blank line, and signature lines
``— <key name> base64(4-byte key ID || Ed25519 signature of the text)``. The key ID is
``SHA-256(key name || 0x0A || 0x01 || public key)[:4]``. A verifier key ("vkey") is written
``<name>+<hex key ID>+base64(0x01 || public key)``.

A checkpoint is a note whose text is three lines: the log's origin, the tree size in decimal, the
base64 RFC 6962 root hash. MANTA's ledger signs one per appended batch with the aggregator's key,
under the key name equal to the origin, and publishes no extension lines. The same text is what a
volunteer keeps to check a proof against, and what a witness would cosign.

:class:`protocol.ledger_checkpoint.Checkpoint` is the parsed form; this module has the text formats.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re

from protocol.identity import PUBLIC_KEY_BYTES, SIGNATURE_BYTES, Identity, verify_signature

ED25519_TYPE = 0x01
SIGNATURE_DASH = "\u2014"
MAX_NOTE_BYTES = 16 * 1024
MAX_SIGNATURES = 16
_NAME_RE = re.compile(r"[^\s+]+")


class NoteError(ValueError):
    """A note or verifier key that is malformed or whose signature does not verify."""


def _check_name(name: str) -> None:
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise NoteError(f"invalid key name {name!r}: must be non-empty, without spaces or '+'")


def key_id(name: str, public_key: bytes) -> bytes:
    """The 4-byte C2SP key ID of an Ed25519 key under ``name``."""
    _check_name(name)
    return hashlib.sha256(name.encode() + b"\n" + bytes([ED25519_TYPE]) + public_key).digest()[:4]


def vkey(name: str, public_key: bytes) -> str:
    """The verifier key string ``name+keyid+base64(0x01||key)``."""
    return (
        f"{name}+{key_id(name, public_key).hex()}+"
        + base64.b64encode(bytes([ED25519_TYPE]) + public_key).decode()
    )


def parse_vkey(text: str) -> tuple[str, bytes]:
    """``(name, public_key)`` of an Ed25519 verifier key; NoteError if malformed or inconsistent."""
    parts = text.strip().split("+")
    if len(parts) != 3:
        raise NoteError("a verifier key is <name>+<hex key id>+<base64 key>")
    name, hex_id, b64 = parts
    _check_name(name)
    try:
        raw = base64.b64decode(b64, validate=True)
        wanted = bytes.fromhex(hex_id)
    except (binascii.Error, ValueError):
        raise NoteError("a verifier key's key id is hex and its key base64") from None
    if len(raw) != 1 + PUBLIC_KEY_BYTES or raw[0] != ED25519_TYPE:
        raise NoteError("only Ed25519 verifier keys (type 0x01) are supported")
    if key_id(name, raw[1:]) != wanted:
        raise NoteError("the verifier key's key id does not match its name and key")
    return name, raw[1:]


def sign_note(text: str, name: str, identity: Identity) -> str:
    """The signed note of ``text`` (which must end in a newline) by ``identity`` under ``name``."""
    _check_text(text)
    signature = identity.sign(text.encode())
    blob = base64.b64encode(key_id(name, identity.public_key) + signature).decode()
    return f"{text}\n{SIGNATURE_DASH} {name} {blob}\n"


def _check_text(text: str) -> None:
    if not isinstance(text, str) or not text.endswith("\n"):
        raise NoteError("note text must end with a newline")
    if any(ord(c) < 0x20 and c != "\n" for c in text):
        raise NoteError("note text must not contain control characters other than newline")


def split_note(note: str) -> tuple[str, list[tuple[str, bytes, bytes]]]:
    """``(text, [(name, key_id, signature), ...])`` of a note; NoteError if it is not well formed."""
    if not isinstance(note, str) or len(note.encode()) > MAX_NOTE_BYTES:
        raise NoteError("not a note, or larger than a note may be")
    cut = note.rfind("\n\n")
    if cut < 0 or not note.endswith("\n"):
        raise NoteError("a signed note is text, a blank line, then signature lines")
    text, sig_block = note[: cut + 1], note[cut + 2 :]
    _check_text(text)
    signatures = []
    for line in sig_block[:-1].split("\n"):
        if not line.startswith(SIGNATURE_DASH + " "):
            raise NoteError(f"malformed signature line {line[:40]!r}")
        name, _, blob = line[2:].partition(" ")
        _check_name(name)
        try:
            raw = base64.b64decode(blob, validate=True)
        except (binascii.Error, ValueError):
            raise NoteError("a signature line's signature is not base64") from None
        if len(raw) < 5:
            raise NoteError("a signature line's signature is too short")
        signatures.append((name, raw[:4], raw[4:]))
    if not signatures or len(signatures) > MAX_SIGNATURES:
        raise NoteError(f"a note carries 1 to {MAX_SIGNATURES} signatures")
    return text, signatures


def open_note(note: str, name: str, public_key: bytes) -> str:
    """The text of ``note`` once the signature by (``name``, ``public_key``) verifies.

    Per the spec, signatures by other keys are ignored; a signature by this key that fails, or the
    absence of one, raises NoteError.
    """
    text, signatures = split_note(note)
    wanted = key_id(name, public_key)
    found = False
    for sig_name, sig_id, signature in signatures:
        if sig_name != name or sig_id != wanted:
            continue
        if len(signature) != SIGNATURE_BYTES or not verify_signature(public_key, text.encode(), signature):
            raise NoteError(f"the signature by {name} does not verify")
        found = True
    if not found:
        raise NoteError(f"the note carries no signature by {name} with key id {wanted.hex()}")
    return text


def checkpoint_body(origin: str, size: int, root: bytes) -> str:
    """The three-line checkpoint text (origin, decimal size, base64 root)."""
    return f"{origin}\n{size}\n{base64.b64encode(root).decode()}\n"


def parse_checkpoint_body(text: str) -> tuple[str, int, bytes]:
    """``(origin, size, root)`` of a checkpoint text; extension lines are refused (MANTA writes none)."""
    lines = text.split("\n")
    if len(lines) != 4 or lines[3] != "":
        raise NoteError("a MANTA checkpoint is exactly three lines: origin, size, root")
    origin, size_text, root_b64 = lines[:3]
    if not origin or not re.fullmatch(r"0|[1-9][0-9]{0,18}", size_text):
        raise NoteError("a checkpoint's size line is a decimal number without leading zeros")
    try:
        root = base64.b64decode(root_b64, validate=True)
    except (binascii.Error, ValueError):
        raise NoteError("a checkpoint's root line is not base64") from None
    if len(root) != 32:
        raise NoteError("a checkpoint's root is 32 bytes")
    return origin, int(size_text), root
