"""The field types and base model every wire record is built from (strict, bounded, immutable).

They sit apart from the records so that every record module (:mod:`protocol.sealing`,
:mod:`protocol.records`, :mod:`protocol.task_spec`, :mod:`protocol.shards`, ...) can share them.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from protocol.canonical import MAX_SAFE_INTEGER

__all__ = [
    "Decimal",
    "Endorsement",
    "Hex32",
    "HexId",
    "Int53",
    "Name",
    "Origin",
    "PeerId",
    "SignedInt53",
    "StrictModel",
    "Text",
]

Int53 = Annotated[int, Field(ge=0, le=MAX_SAFE_INTEGER)]
SignedInt53 = Annotated[int, Field(ge=-MAX_SAFE_INTEGER, le=MAX_SAFE_INTEGER)]
Hex32 = Annotated[str, StringConstraints(min_length=64, max_length=64, pattern=r"^[0-9a-f]{64}$")]
HexId = Annotated[str, StringConstraints(min_length=2, max_length=128, pattern=r"^(?:[0-9a-f]{2})+$")]
PeerId = Annotated[
    str, StringConstraints(min_length=16, max_length=128, pattern=r"^[1-9A-HJ-NP-Za-km-z]+$")
]  # libp2p base58btc (Qm... for RSA keys, 12D3KooW... for Ed25519 keys)
# a libp2p key's signature of a MANTA key (protocol.peer_keys), hex
Endorsement = Annotated[str, StringConstraints(min_length=128, max_length=128, pattern=r"^[0-9a-f]{128}$")]
Name = Annotated[
    str, StringConstraints(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$")
]
Text = Annotated[str, StringConstraints(max_length=256, pattern=r"^[\x20-\x7e]*$")]
Decimal = Annotated[
    str, StringConstraints(max_length=32, pattern=r"^[0-9]+(?:\.[0-9]+)?(?:[eE]-?[0-9]{1,3})?$")
]
Origin = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=r"^[\x21-\x2a\x2c-\x7e]+$")]


class StrictModel(BaseModel):
    """Base of every MANTA wire model: strict, closed, immutable."""

    model_config = ConfigDict(
        extra="forbid", strict=True, frozen=True, validate_default=True, hide_input_in_errors=True
    )
