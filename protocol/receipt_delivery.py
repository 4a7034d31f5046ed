"""What a peer hands an aggregator's ``submit`` call: its identity binding, then the receipt.

The aggregator learns which key speaks for a peer id only from that peer itself: the binding comes
over the libp2p stream the sender authenticated, beside each receipt, never from the DHT. Wire
form: ``binding + b"\\n\\n" + receipt`` (a sealed record never holds an empty line), or the receipt
alone. Pure: bytes in, bytes out; the records' signatures are checked by the reader.
"""

from __future__ import annotations

from dataclasses import dataclass

SEPARATOR = b"\n\n"


@dataclass(frozen=True)
class ReceiptDelivery:
    """``receipt``: a sealed ContributionReceipt; ``binding``: the sender's sealed IdentityBinding."""

    receipt: bytes
    binding: bytes | None = None

    def to_bytes(self) -> bytes:
        return self.receipt if self.binding is None else self.binding + SEPARATOR + self.receipt

    @classmethod
    def from_bytes(cls, payload: bytes) -> ReceiptDelivery:
        """ValueError (one line) if ``payload`` holds more than a binding and a receipt."""
        parts = bytes(payload).split(SEPARATOR)
        if len(parts) == 1:
            return cls(parts[0])
        if len(parts) == 2 and parts[0] and parts[1]:
            return cls(parts[1], parts[0])
        raise ValueError("a delivery is a binding, an empty line and a receipt")
