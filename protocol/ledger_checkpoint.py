"""A ledger's signed tree head (:class:`Checkpoint`): the parsed form of a C2SP checkpoint note.

It travels as a signed note (:mod:`protocol.note` has the text formats), not as a sealed record.
"""

from __future__ import annotations

from protocol.fields import Hex32, Int53, Origin, StrictModel
from protocol.identity import Identity
from protocol.note import checkpoint_body, open_note, parse_checkpoint_body, sign_note, split_note

__all__ = ["Checkpoint"]


class Checkpoint(StrictModel):
    """A signed tree head of a ledger: its origin, size and RFC 6962 root (hex)."""

    origin: Origin
    size: Int53
    root: Hex32

    @property
    def root_bytes(self) -> bytes:
        return bytes.fromhex(self.root)

    def body(self) -> str:
        """The checkpoint note's text (origin, size, base64 root), without signatures."""
        return checkpoint_body(self.origin, self.size, self.root_bytes)

    def to_note(self, identity: Identity) -> str:
        """The checkpoint note signed by ``identity`` under the key name ``origin``."""
        return sign_note(self.body(), self.origin, identity)

    @classmethod
    def from_note(cls, note: str, public_key: bytes, name: str | None = None) -> Checkpoint:
        """Parse a checkpoint note after checking its signature by ``public_key`` under the key name
        ``name`` (default: the checkpoint's own origin line); NoteError if malformed or unsigned."""
        text, _ = split_note(note)
        origin, size, root = parse_checkpoint_body(text)
        open_note(note, name or origin, public_key)
        return cls(origin=origin, size=size, root=root.hex())
