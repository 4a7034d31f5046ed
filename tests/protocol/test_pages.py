"""The page framing every large blob (checkpoint file, training state) travels in."""

from __future__ import annotations

import pytest

from protocol.pages import error_page, page_request, parse_page_request, read_page, write_page


def test_pages_carry_a_header_and_raw_bytes():
    data = bytes(range(256)) * 3 + b"\n\n"
    header, body = read_page(write_page(10_000, 512, data))
    assert header == {"size": 10_000, "offset": 512} and body == data
    assert read_page(error_page("no such file"))[0] == {"error": "no such file"}
    with pytest.raises(ValueError, match="malformed"):
        read_page(b"not json\n")


def test_a_page_request_names_a_64_hex_key_and_an_offset():
    assert parse_page_request(page_request("ab" * 32, 4096)) == ("ab" * 32, 4096)
    for bad in (
        b"{}",
        b"not json",
        b'{"key": "zz", "offset": 0}',
        b'{"key": "' + b"a" * 64 + b'", "offset": -1}',
    ):
        with pytest.raises(ValueError, match="malformed page request"):
            parse_page_request(bad)
