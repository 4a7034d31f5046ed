"""Signed evaluation requests: only the task's aggregator, for this task, from the node it names, to
this peer, fresh, unmodified; and the checkpoint page framing."""

from __future__ import annotations

import json

import pytest

from protocol.evaluation_requests import MAX_AGE_MS, RequestRefused, open_request, sign_request
from protocol.identity import Identity

AGGREGATOR = Identity.from_seed(b"a" * 32)
CHECKPOINT = {"sha256": "ab" * 32, "size": 1234, "digest": "cd" * 32, "round": 7}
NOW = 1_800_000_000_000


def _wire(identity=AGGREGATOR, **changes) -> bytes:
    fields = dict(task_id="digits-local", requester="QmRequester", peer="QmPeer", checkpoint=CHECKPOINT,
                  evaluator={"val_samples": 48, "bn_batches": 1, "seed": 0},
                  share={"kind": "manta-search-share", "version": 1, "configs": []}, timestamp_ms=NOW)  # fmt: skip
    return sign_request(identity, **{**fields, **changes})


def _open(wire: bytes, **changes) -> dict:
    where = dict(task_id="digits-local", aggregator_keys=[AGGREGATOR.public_key_hex], sender="QmRequester",
                 me="QmPeer", now_ms=NOW)  # fmt: skip
    return open_request(wire, **{**where, **changes})


def test_a_request_of_the_aggregator_opens_with_everything_it_signed():
    body = _open(_wire())
    assert body["checkpoint"] == CHECKPOINT and body["evaluator"]["val_samples"] == 48
    assert body["aggregator_key"] == AGGREGATOR.public_key_hex
    assert _open(_wire(), now_ms=NOW + MAX_AGE_MS)["timestamp"] == NOW  # at the edge of the window


@pytest.mark.parametrize(
    "wire, where, reason",
    [
        (lambda: _wire(Identity.from_seed(b"s" * 32)), {}, "not signed by an aggregator"),
        (lambda: _wire().replace(b'"round":7', b'"round":8'), {}, "signature does not verify"),
        (lambda: _wire(task_id="other"), {}, "a request for task 'other'"),
        (lambda: _wire(), {"sender": "QmSomeoneElse"}, "another requester"),
        (lambda: _wire(peer="QmOtherPeer"), {}, "meant for another peer"),
        (lambda: _wire(timestamp_ms=NOW - MAX_AGE_MS - 1), {}, "stale request"),
        (
            lambda: _wire(checkpoint={"sha256": "xyz", "size": 1, "digest": "d"}),
            {},
            "checkpoint needs sha256",
        ),
        (lambda: _wire().rpartition(b"\n")[0], {}, "malformed request"),
        (lambda: b"manta/receipt/v1\n{}\ned25519 " + b"0" * 64 + b" " + b"0" * 128, {}, "malformed request"),
        (lambda: "text", {}, "malformed request"),
    ],
    ids=[
        "stranger",
        "tampered",
        "other-task",
        "replayed",
        "other-peer",
        "stale",
        "bad-checkpoint",
        "unsigned",
        "other-record",
        "not-bytes",
    ],  # fmt: skip
)
def test_refusals_say_why(wire, where, reason):
    with pytest.raises(RequestRefused, match=reason):
        _open(wire(), **where)


def test_a_body_that_is_not_an_object_is_refused_even_when_signed():
    message = b"manta/evaluate/v1\n" + json.dumps([1, 2]).encode()
    wire = (
        message
        + b"\ned25519 "
        + AGGREGATOR.public_key.hex().encode()
        + b" "
        + AGGREGATOR.sign(message).hex().encode()
    )
    with pytest.raises(RequestRefused, match="not a JSON object"):
        _open(wire)
