"""Canonical JSON (RFC 8785 through the rfc8785 library) and domain-separated signed messages."""

from __future__ import annotations

import json
import random
import string

import pytest

from protocol.canonical import (
    MAX_SAFE_INTEGER,
    CanonicalError,
    ascii_canonical_json,
    canonical_json,
    domain_prefix,
    signed_message,
    split_signed_message,
)


def test_rfc8785_sorting_whitespace_and_escapes():
    value = {"b": [True, None, "x"], "a": {"d": 1, "c": -2}, "\u00e9": '\u20ac\n"\\\u0001'}
    assert (
        canonical_json(value)
        == '{"a":{"c":-2,"d":1},"b":[true,null,"x"],"\u00e9":"\u20ac\\n\\"\\\\\\u0001"}'.encode()
    )
    assert b"\n" not in canonical_json({"text": "two\nlines"})


def test_signed_payloads_are_integers_in_the_safe_range():
    assert canonical_json({"n": MAX_SAFE_INTEGER}) == b'{"n":9007199254740991}'
    for bad in (
        {"n": MAX_SAFE_INTEGER + 1},
        {"f": 0.5},
        {"f": [1.0]},
        {1: "non-string key"},
        {"x": object()},
    ):
        with pytest.raises(CanonicalError):
            canonical_json(bad)


def test_domain_prefix_names_type_and_version():
    assert domain_prefix("receipt", 1) == b"manta/receipt/v1\n"
    message = signed_message("receipt", 1, b'{"a":1}')
    assert message == b'manta/receipt/v1\n{"a":1}'
    assert split_signed_message(message) == ("receipt", 1, b'{"a":1}')
    for bad_type, bad_version in (("Receipt", 1), ("receipt", 0), ("a b", 1), ("", 1)):
        with pytest.raises(ValueError):
            domain_prefix(bad_type, bad_version)
    with pytest.raises(CanonicalError):
        signed_message("receipt", 1, b'{"a":\n1}')
    for bad in (
        b'{"a":1}',
        b"manta/receipt/v1",
        b"manta/receipt/v1\n{}\n{}",
        b"manta/receipt/v01\n{}",
        b"x/receipt/v1\n{}",
    ):
        with pytest.raises(ValueError):
            split_signed_message(bad)


def _random_value(rng: random.Random, depth: int = 0):
    kind = rng.randrange(6 if depth < 3 else 4)
    if kind == 0:
        return rng.randrange(-MAX_SAFE_INTEGER, MAX_SAFE_INTEGER + 1)
    if kind == 1:
        return "".join(rng.choice(string.printable[:95]) for _ in range(rng.randrange(12)))  # printable ASCII
    if kind == 2:
        return rng.choice([True, False, None])
    if kind == 3:
        return rng.choice(['"', "\\", '\\"', "", " ", "~", "a/b", "</script>"])
    if kind == 4:
        return [_random_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {
        "".join(rng.choice(string.ascii_letters + "_") for _ in range(rng.randrange(1, 6))): _random_value(
            rng, depth + 1
        )
        for _ in range(rng.randrange(5))
    }


def test_fast_ascii_encoder_equals_the_library_on_record_shaped_values():
    rng = random.Random(8785)
    for _ in range(3000):
        value = {"k": _random_value(rng)}
        assert ascii_canonical_json(value) == canonical_json(value)
    assert json.loads(ascii_canonical_json({"b": 1, "a": [1, "x"]})) == {"a": [1, "x"], "b": 1}
