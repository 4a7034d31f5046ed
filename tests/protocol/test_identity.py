"""Ed25519 identities on disk: creation mode, refusal of readable keys, signatures, RFC 8032 vector."""

from __future__ import annotations

import hashlib
import os
import stat

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed448 import Ed448PrivateKey

from protocol.identity import DEFAULT_IDENTITY_PATH, Identity, IdentityError, fingerprint, verify_signature


def test_default_path_is_under_home():
    assert str(DEFAULT_IDENTITY_PATH) == "~/.manta/identity.key"


def test_load_or_create_makes_a_private_key_file_and_reloads_it(tmp_path):
    path = tmp_path / "sub" / "identity.key"
    created = Identity.load_or_create(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    again = Identity.load_or_create(path)
    loaded = Identity.load(path)
    assert created.public_key == again.public_key == loaded.public_key
    assert len(created.public_key) == 32 and created.public_key_hex == created.public_key.hex()
    assert (
        created.fingerprint
        == hashlib.sha256(created.public_key).hexdigest()[:16]
        == fingerprint(created.public_key)
    )
    assert path.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")
    assert not list(path.parent.glob(".*tmp")), "no temporary file is left behind"


def test_a_key_made_in_memory_is_stored_once_and_never_over_another(tmp_path):
    # manta-aggregator start makes the key in memory and writes it only once its task is built.
    made = Identity.generate()
    assert made.path is None
    kept = made.store_new(tmp_path / "keys" / "agg.key")
    assert kept.path == tmp_path / "keys" / "agg.key" and kept.public_key == made.public_key
    assert stat.S_IMODE(kept.path.stat().st_mode) == 0o600
    assert Identity.load(kept.path).public_key == made.public_key
    with pytest.raises(FileExistsError):
        Identity.generate().store_new(kept.path)
    assert Identity.load(kept.path).public_key == made.public_key


def test_creation_ignores_a_permissive_umask(tmp_path):
    old = os.umask(0)
    try:
        Identity.load_or_create(tmp_path / "k")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "k").stat().st_mode) == 0o600


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o644, 0o660, 0o601])
def test_a_key_readable_by_group_or_others_is_refused_in_one_line(tmp_path, mode):
    path = tmp_path / "identity.key"
    Identity.load_or_create(path)
    path.chmod(mode)
    for load in (Identity.load, Identity.load_or_create):
        with pytest.raises(IdentityError) as err:
            load(path)
        message = str(err.value)
        assert "readable by group or others" in message and "\n" not in message
        assert f"{mode:04o}" in message


def test_missing_garbage_and_foreign_keys_are_refused(tmp_path):
    with pytest.raises(IdentityError, match="no identity key"):
        Identity.load(tmp_path / "absent.key")
    garbage = tmp_path / "garbage.key"
    garbage.write_bytes(b"not a key")
    garbage.chmod(0o600)
    with pytest.raises(IdentityError, match="not a readable PEM"):
        Identity.load(garbage)
    foreign = tmp_path / "ed448.key"
    foreign.write_bytes(
        Ed448PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    foreign.chmod(0o600)
    with pytest.raises(IdentityError, match="not an Ed25519 key"):
        Identity.load(foreign)
    assert issubclass(IdentityError, ValueError)


def test_rfc8032_test_1():
    # RFC 8032 section 7.1, TEST 1 (empty message).
    ident = Identity.from_seed(
        bytes.fromhex("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60")
    )
    assert ident.public_key_hex == "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a"
    signature = ident.sign(b"")
    assert signature.hex() == (
        "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b"
    )
    assert verify_signature(ident.public_key, b"", signature)


def test_verify_signature_is_a_bool_that_never_raises():
    ident, other = Identity.generate(), Identity.generate()
    signature = ident.sign(b"message")
    assert verify_signature(ident.public_key, b"message", signature) is True
    assert verify_signature(other.public_key, b"message", signature) is False
    assert verify_signature(ident.public_key, b"messagE", signature) is False
    flipped = bytes([signature[0] ^ 1]) + signature[1:]
    assert verify_signature(ident.public_key, b"message", flipped) is False
    for args in [
        (ident.public_key[:31], b"message", signature),
        (ident.public_key, b"message", signature[:63]),
        (ident.public_key.hex(), b"message", signature),
        (ident.public_key, "message", signature),
        (None, None, None),
        (b"\xff" * 32, b"message", signature),  # not a point on the curve
    ]:
        assert verify_signature(*args) is False


def test_only_valid_signatures_are_remembered_and_only_for_their_own_bytes():
    from protocol.identity import _valid_signatures

    ident, other = Identity.generate(), Identity.generate()
    signature = ident.sign(b"endorsement")
    forged = bytes([signature[0] ^ 1]) + signature[1:]
    for _ in range(2):  # the second answers come from memory where there is one
        assert verify_signature(ident.public_key, b"endorsement", signature) is True
        assert verify_signature(ident.public_key, b"endorsement", forged) is False
        assert verify_signature(other.public_key, b"endorsement", signature) is False
        assert verify_signature(ident.public_key, b"endorsemenT", signature) is False
    assert _valid_signatures.key(ident.public_key, b"endorsement", signature) in _valid_signatures
    assert _valid_signatures.key(ident.public_key, b"endorsement", forged) not in _valid_signatures
    assert _valid_signatures.key(other.public_key, b"endorsement", signature) not in _valid_signatures
