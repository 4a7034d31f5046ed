"""What a leaving peer hands an aggregator's ``state-handoff`` call: the state it ends on.

A run's last state lives only on its peers: once they leave, no checkpoint can have it. So a peer
that leaves names the state it holds and the attempt that committed it, keeps serving it, and waits
(bounded) while the aggregator fetches it. Wire form: ``<attempt> <state digest hex>`` in ASCII.
Pure: bytes in, bytes out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_WIRE = re.compile(rb"(\d{1,18}) ([0-9a-f]{64})")


@dataclass(frozen=True)
class StateHandoff:
    """``state_digest`` (hex): the state the sender holds; ``attempt``: the attempt whose commit
    reports name it (the aggregator fetches only a state the commit board names)."""

    attempt: int
    state_digest: str

    def __post_init__(self) -> None:
        if self.attempt < 0 or not re.fullmatch(r"[0-9a-f]{64}", self.state_digest):
            raise ValueError("a state hand-off names an attempt >= 0 and a 64-digit hex state digest")

    def to_bytes(self) -> bytes:
        return f"{self.attempt} {self.state_digest}".encode()

    @classmethod
    def from_bytes(cls, payload: bytes) -> StateHandoff:
        """ValueError (one line) if ``payload`` is not ``<attempt> <64 hex digits>``."""
        found = _WIRE.fullmatch(bytes(payload))
        if found is None:
            raise ValueError("a state hand-off is '<attempt> <64-digit hex state digest>'")
        return cls(int(found.group(1)), found.group(2).decode())
