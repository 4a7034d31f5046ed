"""C2SP signed notes and checkpoints, against the published examples.

Vectors: the example of c2sp.org/signed-note (vkey ``example.com/foo+530d903a+...``, text "This is an
example message.") and the example of golang.org/x/mod/sumdb/note (key ``PeterNeumann``), whose
Ed25519 signature is deterministic, so signing its text with its published secret reproduces it.
"""

from __future__ import annotations

import base64

import pytest

from protocol.identity import Identity
from protocol.ledger_checkpoint import Checkpoint
from protocol.merkle import EMPTY_ROOT
from protocol.note import (
    NoteError,
    key_id,
    open_note,
    parse_checkpoint_body,
    parse_vkey,
    sign_note,
    split_note,
    vkey,
)

SPEC_VKEY = "example.com/foo+530d903a+AekyeRrm56hApGFkyQR4ZCbV54Id2LKaANYcrnKv3U2k"
SPEC_NOTE = (
    "This is an example message.\n\n"
    "\u2014 example.com/foo Uw2QOkn8srV1yJGh2VYRlL1Tnagv1YEq6TfXppzi2ONncAlTgK7Ztg1ERYNZXsYjOBH3mFXmRKuwHjG1Yu72IneyaQM=\n"
)
GO_SKEY = "PRIVATE+KEY+PeterNeumann+c74f20a3+AYEKFALVFGyNhPJEMzD1QIDr+Y7hfZx09iUvxdXHKDFz"
GO_VKEY = "PeterNeumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW"
GO_TEXT = (
    "If you think cryptography is the answer to your problem,\nthen you don't know what your problem is.\n"
)
GO_NOTE = (
    GO_TEXT
    + "\n\u2014 PeterNeumann x08go/ZJkuBS9UG/SffcvIAQxVBtiFupLLr8pAcElZInNIuGUgYN1FFYC2pZSNXgKvqfqdngotpRZb6KE6RyyBwJnAM=\n"
)


def test_the_signed_note_spec_example_verifies():
    name, public_key = parse_vkey(SPEC_VKEY)
    assert name == "example.com/foo"
    assert key_id(name, public_key).hex() == "530d903a"
    assert vkey(name, public_key) == SPEC_VKEY
    assert open_note(SPEC_NOTE, name, public_key) == "This is an example message.\n"
    with pytest.raises(NoteError):
        open_note(SPEC_NOTE.replace("example message", "example massage"), name, public_key)


def test_signing_reproduces_the_go_sumdb_example():
    seed = base64.b64decode(GO_SKEY.split("+", 4)[4])[1:]
    signer = Identity.from_seed(seed)
    assert vkey("PeterNeumann", signer.public_key) == GO_VKEY
    assert sign_note(GO_TEXT, "PeterNeumann", signer) == GO_NOTE
    name, public_key = parse_vkey(GO_VKEY)
    assert open_note(GO_NOTE, name, public_key) == GO_TEXT
    with pytest.raises(NoteError):
        open_note(GO_NOTE.replace("cryptography", "cryptographY"), name, public_key)


def test_unknown_signatures_are_ignored_and_a_missing_one_is_refused():
    alice, bob = Identity.generate(), Identity.generate()
    note = sign_note("hello\n", "alice", alice)
    both = note + sign_note("hello\n", "bob", bob).split("\n\n", 1)[1]
    assert open_note(both, "alice", alice.public_key) == "hello\n"
    assert open_note(both, "bob", bob.public_key) == "hello\n"
    with pytest.raises(NoteError, match="no signature by"):
        open_note(note, "bob", bob.public_key)
    with pytest.raises(NoteError, match="no signature by"):
        open_note(note, "alice", bob.public_key)  # same name, other key: a different key id


@pytest.mark.parametrize(
    "bad",
    [
        "no blank line\n\u2014 a AAAA\n",
        "text\n\n",
        "text\n\n\u2014 alice\n",
        "text\n\n- alice AAAAAAAAAA==\n",
        "text\n\n\u2014 alice !!!notbase64\n",
        "text\n\n\u2014 alice AAAA\n",
        "text\x07\n\n\u2014 alice AAAAAAAAAA==\n",
        "text\n\n\u2014 alice AAAAAAAAAA==",
        "x" * 20000,
    ],
)
def test_malformed_notes_are_refused(bad):
    with pytest.raises(NoteError):
        split_note(bad)


def test_vkeys_are_checked():
    for bad in [
        "name+530d903a",
        "na me+530d903a+AekyeRrm56hApGFkyQR4ZCbV54Id2LKaANYcrnKv3U2k",
        "example.com/foo+530d903b+AekyeRrm56hApGFkyQR4ZCbV54Id2LKaANYcrnKv3U2k",
        "example.com/foo+530d903a+AgkyeRrm56hApGFkyQR4ZCbV54Id2LKaANYcrnKv3U2k",
    ]:
        with pytest.raises(NoteError):
            parse_vkey(bad)


def test_checkpoint_text_format_and_round_trip():
    # The example body of c2sp.org/tlog-checkpoint.
    origin, size, root = parse_checkpoint_body(
        "example.com/behind-the-sofa\n20852163\nCsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=\n"
    )
    assert (origin, size, len(root)) == ("example.com/behind-the-sofa", 20852163, 32)
    log = Identity.generate()
    head = Checkpoint(origin="manta.test/log", size=5, root=root.hex())
    note = head.to_note(log)
    lines = note.split("\n")
    assert lines[:3] == ["manta.test/log", "5", base64.b64encode(root).decode()]
    assert lines[3] == "" and lines[4].startswith("\u2014 manta.test/log ")
    assert Checkpoint.from_note(note, log.public_key) == head
    with pytest.raises(NoteError):
        Checkpoint.from_note(note, Identity.generate().public_key)
    with pytest.raises(NoteError):
        Checkpoint.from_note(note.replace("\n5\n", "\n6\n"), log.public_key)
    for body in [
        "o\n05\nAAAA\n",
        "o\n5\n" + base64.b64encode(EMPTY_ROOT).decode() + "\next\n",
        "o\n-1\nAAAA\n",
        "o\n1\nAAAA\n",
    ]:
        with pytest.raises(NoteError):
            parse_checkpoint_body(body)
