"""The state hand-off's wire form (protocol/state_handoff.py): what a leaving peer names, read back
exactly, and anything else refused in one line."""

from __future__ import annotations

import pytest

from protocol.state_handoff import StateHandoff


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"12",
        b"-1 " + b"a" * 64,
        b"3 " + b"A" * 64,
        b"3 " + b"a" * 63,
        b"3  " + b"a" * 64,
        b"3 " + b"a" * 64 + b"\n",
    ],
)
def test_a_malformed_handoff_is_refused_in_one_line(payload):
    with pytest.raises(ValueError, match="^a state hand-off is '<attempt> <64-digit hex state digest>'$"):
        StateHandoff.from_bytes(payload)


def test_a_handoff_reads_back_as_written():
    handoff = StateHandoff(7, "0f" * 32)
    assert StateHandoff.from_bytes(handoff.to_bytes()) == handoff
