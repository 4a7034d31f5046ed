"""A node's libp2p key, the peer id made from it, and the endorsement that binds a MANTA key to it.

Every MANTA node runs its libp2p daemon on an Ed25519 key that MANTA makes (:class:`Libp2pKey`), so
its peer id is the key itself (libp2p's identity multihash of the protobuf public key, base58:
``12D3KooW...``) and anyone can read the key back from the id (:func:`public_key_of`).

The two keys sign each other:

* the MANTA key seals every record that names the peer id (``peer_id`` + ``public_key`` fields);
* the libp2p key signs the MANTA key: the **endorsement**, ``sign(b"manta/endorsement/v1\\n" + MANTA
  public key)``, hex, carried in those records.

So a record that speaks for a peer id holds only if the key behind that id endorsed its sealer
(:func:`endorsement_holds`, checked by :func:`protocol.sealing.open_sealed`): nobody can speak for a
peer id whose libp2p key they do not hold. :class:`Speaker` is what a node signs as.

Key files are libp2p's own format (a protobuf ``PrivateKey``: type Ed25519, 64 bytes of seed and
public key), which the daemon reads with ``-id``; mode 0600. Pure Python.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from protocol.identity import PUBLIC_KEY_BYTES, Identity, IdentityError, verify_signature

__all__ = [
    "ENDORSEMENT_DOMAIN",
    "Libp2pKey",
    "Speaker",
    "endorsement_holds",
    "peer_id_of",
    "public_key_of",
]

ENDORSEMENT_DOMAIN = b"manta/endorsement/v1\n"
_B58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
_B58_INDEX = {c: i for i, c in enumerate(_B58)}
# protobuf PublicKey{Type: Ed25519 (1), Data: 32 bytes}, inside an identity multihash (code 0, length 36)
_PUBLIC_PROTOBUF = b"\x08\x01\x12\x20"
_PEER_ID_PREFIX = b"\x00\x24" + _PUBLIC_PROTOBUF
# protobuf PrivateKey{Type: Ed25519 (1), Data: 64 bytes: seed then public key}
_PRIVATE_PROTOBUF = b"\x08\x01\x12\x40"
_KEY_FILE_BYTES = len(_PRIVATE_PROTOBUF) + 64


def _b58encode(data: bytes) -> str:
    n = int.from_bytes(data, "big")
    out = []
    while n:
        n, r = divmod(n, 58)
        out.append(_B58[r])
    zeros = len(data) - len(data.lstrip(b"\0"))
    return "1" * zeros + "".join(reversed(out))


def _b58decode(text: str) -> bytes | None:
    n = 0
    for c in text:
        digit = _B58_INDEX.get(c)
        if digit is None:
            return None
        n = n * 58 + digit
    zeros = len(text) - len(text.lstrip("1"))
    body = n.to_bytes((n.bit_length() + 7) // 8, "big") if n else b""
    return b"\0" * zeros + body


def peer_id_of(public_key: bytes) -> str:
    """The libp2p peer id of an Ed25519 libp2p public key (32 raw bytes)."""
    if len(public_key) != PUBLIC_KEY_BYTES:
        raise ValueError(f"an Ed25519 public key is {PUBLIC_KEY_BYTES} bytes, got {len(public_key)}")
    return _b58encode(_PEER_ID_PREFIX + public_key)


def public_key_of(peer_id: str) -> bytes | None:
    """The Ed25519 public key a peer id is made of; None for any other id (an RSA key's ``Qm...``
    hash, or not a peer id at all)."""
    if not isinstance(peer_id, str) or len(peer_id) > 64:
        return None
    raw = _b58decode(peer_id)
    if (
        raw is None
        or len(raw) != len(_PEER_ID_PREFIX) + PUBLIC_KEY_BYTES
        or not raw.startswith(_PEER_ID_PREFIX)
    ):
        return None
    return raw[len(_PEER_ID_PREFIX) :]


def endorsement_holds(peer_id: str, manta_public_key_hex: str, endorsement_hex: str) -> bool:
    """Whether the libp2p key of ``peer_id`` signed ``manta_public_key_hex`` (never raises)."""
    libp2p_public = public_key_of(peer_id)
    try:
        manta_public, signature = bytes.fromhex(manta_public_key_hex), bytes.fromhex(endorsement_hex)
    except (TypeError, ValueError):
        return False
    if libp2p_public is None or len(manta_public) != PUBLIC_KEY_BYTES:
        return False
    return verify_signature(libp2p_public, ENDORSEMENT_DOMAIN + manta_public, signature)


class Libp2pKey:
    """A node's Ed25519 libp2p key: its peer id, the bytes its daemon reads, its endorsements."""

    __slots__ = ("_key", "path")

    def __init__(self, key: Identity, path: Path | None = None) -> None:
        self._key, self.path = key, path

    @classmethod
    def generate(cls) -> Libp2pKey:
        return cls(Identity.generate())

    @classmethod
    def from_seed(cls, seed: bytes) -> Libp2pKey:
        """The key of a 32-byte Ed25519 seed (deterministic tests)."""
        return cls(Identity.from_seed(seed))

    @classmethod
    def load_or_create(cls, path: str | os.PathLike[str]) -> Libp2pKey:
        """The key in libp2p's file format at ``path``, created there (mode 0600) when missing;
        IdentityError (one line) if the file is not an Ed25519 libp2p key or cannot be written."""
        file = Path(path).expanduser()
        if not file.exists():
            key = cls.generate()
            tmp = file.with_name(f".{file.name}.{os.getpid()}.tmp")
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                with os.fdopen(fd, "wb") as out:
                    out.write(key.private_protobuf())
                os.replace(tmp, file)
            except OSError as exc:
                raise IdentityError(f"cannot write libp2p key {file}: {exc.strerror or exc}") from None
            return cls(key._key, file)
        try:
            data = file.read_bytes()
        except OSError as exc:
            raise IdentityError(f"cannot read libp2p key {file}: {exc.strerror or exc}") from None
        if len(data) != _KEY_FILE_BYTES or not data.startswith(_PRIVATE_PROTOBUF):
            raise IdentityError(f"{file} is not an Ed25519 libp2p key (remove it to make a new one)")
        seed, public = data[4:36], data[36:]
        key = Identity.from_seed(seed)
        if key.public_key != public:
            raise IdentityError(f"{file} is not an Ed25519 libp2p key: its public half does not match")
        return cls(key, file)

    @property
    def public_key(self) -> bytes:
        return self._key.public_key

    @property
    def peer_id(self) -> str:
        return peer_id_of(self._key.public_key)

    def private_protobuf(self) -> bytes:
        """The key in libp2p's file format (what ``p2pd -id FILE`` reads)."""
        return _PRIVATE_PROTOBUF + self._key.private_seed() + self._key.public_key

    def endorse(self, manta_public_key: bytes) -> str:
        """This key's endorsement of a MANTA public key (hex)."""
        return self._key.sign(ENDORSEMENT_DOMAIN + manta_public_key).hex()


@dataclass(frozen=True)
class Speaker:
    """What a node signs as: its MANTA key, the peer id it runs under, and that id's endorsement of
    the key (:meth:`of` makes it; ValueError if the three do not agree)."""

    identity: Identity
    peer_id: str
    endorsement: str

    def __post_init__(self) -> None:
        if not endorsement_holds(self.peer_id, self.identity.public_key_hex, self.endorsement):
            raise ValueError(f"peer {self.peer_id} does not endorse key {self.identity.fingerprint}")

    @classmethod
    def of(cls, identity: Identity, libp2p_key: Libp2pKey) -> Speaker:
        return cls(identity, libp2p_key.peer_id, libp2p_key.endorse(identity.public_key))

    @property
    def public_key_hex(self) -> str:
        return self.identity.public_key_hex
