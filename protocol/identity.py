"""Ed25519 identities of peers and aggregators, kept in a private key file.

Contract (other modules build on these names):

* ``Identity.load_or_create(path)`` loads the key at ``path``, creating it (mode 0600, parent folder
  0700) when missing; ``Identity.load(path)`` only loads. Both refuse, with :class:`IdentityError` (a
  ``ValueError``; CLIs turn it into one line), a key file that group or others may read, a file that
  is not an Ed25519 private key, or a missing file (``load``).
* ``identity.public_key`` (32 raw bytes), ``identity.public_key_hex``, ``identity.fingerprint``
  (16 hex digits: the first 8 bytes of SHA-256 of the raw public key, reproducible with ``sha256sum``),
  ``identity.sign(message) -> 64-byte signature``.
* :func:`verify_signature` checks a signature and never raises.
* :data:`DEFAULT_IDENTITY_PATH` is ``~/.manta/identity.key`` (expanded when used, so ``HOME`` decides).

The file is the standard unencrypted PKCS#8 PEM form (``openssl pkey -in identity.key`` reads it).
Who may read it is the protection; it never leaves the machine. A peer's identity is separate from its
hivemind/libp2p identity (which hivemind may regenerate each run); an ``IdentityBinding`` record signed
with this key names the peer id it currently uses (see ``protocol.records``).
"""

from __future__ import annotations

import hashlib
import os
import stat
import threading
from collections import OrderedDict
from functools import lru_cache
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

DEFAULT_IDENTITY_PATH = Path("~/.manta/identity.key")
PUBLIC_KEY_BYTES = 32
SIGNATURE_BYTES = 64
_MAX_KEY_FILE_BYTES = 4096


class IdentityError(ValueError):
    """An identity key file that cannot be used; the message is one line for the user."""


def fingerprint(public_key: bytes) -> str:
    """Short, stable name of a public key: hex of the first 8 bytes of SHA-256(public key)."""
    return hashlib.sha256(public_key).digest()[:8].hex()


def check_public_key_hex(text: str, option: str = "public key") -> str:
    """``text`` as a lower-case 64-digit hex Ed25519 public key; IdentityError (one line) if it is not one."""
    key = text.strip().lower()
    if len(key) != 64 or any(c not in "0123456789abcdef" for c in key):
        raise IdentityError(f"{option} must be a 64-digit hex public key, got {text!r}")
    return key


class Identity:
    """An Ed25519 signing key (a peer's or an aggregator's)."""

    __slots__ = ("_private", "public_key", "path")

    def __init__(self, private_key: Ed25519PrivateKey, path: Path | None = None) -> None:
        self._private = private_key
        self.public_key: bytes = private_key.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )
        self.path = path

    # -- construction -------------------------------------------------------------------------
    @classmethod
    def generate(cls) -> Identity:
        """A fresh key kept only in memory (tests, benchmarks)."""
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def from_seed(cls, seed: bytes) -> Identity:
        """The key whose RFC 8032 32-byte secret seed is ``seed`` (test vectors, deterministic tests)."""
        if len(seed) != 32:
            raise IdentityError(f"an Ed25519 seed is 32 bytes, got {len(seed)}")
        return cls(Ed25519PrivateKey.from_private_bytes(seed))

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Identity:
        """Load the key at ``path``; IdentityError if missing, unreadable, too open or not Ed25519."""
        file = Path(path).expanduser()
        try:
            fd = os.open(file, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except FileNotFoundError:
            raise IdentityError(
                f"no identity key at {file} (create one with `manta-peer identity`)"
            ) from None
        except OSError as exc:
            raise IdentityError(f"cannot open identity key {file}: {exc.strerror or exc}") from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise IdentityError(f"identity key {file} is not a regular file")
            if info.st_mode & 0o077:
                raise IdentityError(
                    f"identity key {file} is readable by group or others "
                    f"(mode {stat.S_IMODE(info.st_mode):04o}); run `chmod 600 {file}`"
                )
            data = os.read(fd, _MAX_KEY_FILE_BYTES + 1)
        finally:
            os.close(fd)
        if len(data) > _MAX_KEY_FILE_BYTES:
            raise IdentityError(f"identity key {file} is too large to be a key file")
        try:
            key = serialization.load_pem_private_key(data, password=None)
        except (ValueError, TypeError) as exc:
            raise IdentityError(f"identity key {file} is not a readable PEM private key ({exc})") from None
        if not isinstance(key, Ed25519PrivateKey):
            raise IdentityError(f"identity key {file} is not an Ed25519 key")
        return cls(key, file)

    @classmethod
    def load_or_create(cls, path: str | os.PathLike[str] = DEFAULT_IDENTITY_PATH) -> Identity:
        """Load the key at ``path``, or create it there (mode 0600) when the file does not exist."""
        file = Path(path).expanduser()
        if not os.path.lexists(file):
            try:
                return cls._create(file)
            except FileExistsError:  # another process created it meanwhile: use theirs
                pass
        return cls.load(file)

    def store_new(self, path: str | os.PathLike[str]) -> Identity:
        """Write this key (made in memory) to ``path`` with mode 0600 and return it with that path:
        a command that signs can check all its input before it creates the key file.
        FileExistsError if a file is there; IdentityError if it cannot be written."""
        return self._create(Path(path).expanduser(), self._private)

    @classmethod
    def _create(cls, file: Path, key: Ed25519PrivateKey | None = None) -> Identity:
        try:
            file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise IdentityError(f"cannot create folder {file.parent}: {exc.strerror or exc}") from None
        key = key or Ed25519PrivateKey.generate()
        pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        tmp = file.with_name(f".{file.name}.{os.getpid()}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError as exc:
            raise IdentityError(f"cannot create identity key {file}: {exc.strerror or exc}") from None
        try:
            os.fchmod(fd, 0o600)  # whatever the umask
            os.write(fd, pem)
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, file)  # atomic and never replaces a key someone else just created
        except FileExistsError:
            raise
        except OSError as exc:
            raise IdentityError(f"cannot create identity key {file}: {exc.strerror or exc}") from None
        finally:
            os.unlink(tmp)
        return cls(key, file)

    # -- use ----------------------------------------------------------------------------------
    @property
    def public_key_hex(self) -> str:
        return self.public_key.hex()

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.public_key)

    def private_seed(self) -> bytes:
        """The 32-byte RFC 8032 secret seed (for writing the key in another file format)."""
        return self._private.private_bytes(
            serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
        )

    def sign(self, message: bytes) -> bytes:
        """The 64-byte Ed25519 signature of ``message`` (deterministic, RFC 8032)."""
        return self._private.sign(message)

    def __repr__(self) -> str:
        return f"Identity(fingerprint={self.fingerprint}, path={self.path})"


@lru_cache(maxsize=4096)
def _public_key(raw: bytes) -> Ed25519PublicKey:
    return Ed25519PublicKey.from_public_bytes(raw)


class _ValidSignatures:
    """The signatures found valid lately, keyed by key, signature and a 256-bit hash of the message.

    A peer's endorsement, binding and certificate travel unchanged inside every record it makes, and
    every reader checks them again (each check is about 0.2 ms here); a hit costs one hash. Only valid
    signatures are kept, so forged ones cannot push out the ones that count. Bounded, least recent out."""

    def __init__(self, capacity: int):
        self._capacity = capacity
        self._lock = threading.Lock()  # guards _seen
        self._seen: OrderedDict[tuple[bytes, bytes, bytes], None] = OrderedDict()

    @staticmethod
    def key(public_key: bytes, message: bytes, signature: bytes) -> tuple[bytes, bytes, bytes]:
        return public_key, signature, hashlib.blake2b(message, digest_size=32).digest()

    def __contains__(self, key: tuple[bytes, bytes, bytes]) -> bool:
        with self._lock:
            if key in self._seen:
                self._seen.move_to_end(key)
                return True
            return False

    def add(self, key: tuple[bytes, bytes, bytes]) -> None:
        with self._lock:
            self._seen[key] = None
            while len(self._seen) > self._capacity:
                self._seen.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._seen.clear()


_valid_signatures = _ValidSignatures(capacity=4096)  # about 1 MiB


def forget_valid_signatures() -> None:
    """Forget the signatures found valid so far: each is checked in full once more (for benchmarks)."""
    _valid_signatures.clear()


def verify_signature(public_key: bytes, message: bytes, signature: bytes) -> bool:
    """True iff ``signature`` is a valid Ed25519 signature of ``message`` by ``public_key``.

    Never raises: a key or signature of the wrong length or type, or an invalid key, gives False.
    A signature found valid lately is answered without checking it again (:class:`_ValidSignatures`).
    """
    if not (
        isinstance(public_key, bytes)
        and isinstance(message, bytes)
        and isinstance(signature, bytes)
        and len(public_key) == PUBLIC_KEY_BYTES
        and len(signature) == SIGNATURE_BYTES
    ):
        return False
    key = _valid_signatures.key(public_key, message, signature)
    if key in _valid_signatures:
        return True
    try:
        _public_key(public_key).verify(signature, message)
    except (InvalidSignature, ValueError):
        return False
    _valid_signatures.add(key)
    return True
