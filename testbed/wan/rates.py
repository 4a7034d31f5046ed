"""Link rates as ``tc`` writes them (``20mbit``, ``1gbit``, ``500kbit``, ``10mbps``), in bits per second.

The testbed's options take the same spelling as ``tc`` so that a figure copied from a ``tc`` command,
or from the issue that asked for it, means the same here: SI prefixes (``kbit`` = 1000 bit/s), binary
ones with an ``i`` (``kibit`` = 1024 bit/s), and ``bps`` for *bytes* per second as ``tc`` has it.
"""

from __future__ import annotations

import re

_PREFIX = {
    "": 1,
    "k": 10**3,
    "m": 10**6,
    "g": 10**9,
    "t": 10**12,
    "ki": 2**10,
    "mi": 2**20,
    "gi": 2**30,
    "ti": 2**40,
}
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(|k|m|g|t|ki|mi|gi|ti)(bit|bps)?\s*$", re.IGNORECASE)


class RateError(ValueError):
    """A rate that is not in tc's notation; the message is one line for the user."""


def parse_rate(text: str) -> int:
    """``"20mbit"`` -> 20_000_000 (bits per second). A bare number is bits per second, as in tc."""
    match = _RATE.match(str(text))
    if not match:
        raise RateError(f"rate must be written as tc writes it (e.g. 20mbit, 1gbit, 500kbit), got {text!r}")
    number, prefix, unit = match.group(1), match.group(2).lower(), (match.group(3) or "bit").lower()
    bits = float(number) * _PREFIX[prefix] * (8 if unit == "bps" else 1)
    if bits < 8000:
        raise RateError(f"rate {text!r} is below 8kbit, too slow to carry a TCP connection")
    return int(bits)


def format_rate(bits_per_second: float) -> str:
    """20_000_000 -> ``"20mbit"``; the largest SI unit that keeps at most one decimal."""
    for prefix, scale in (("g", 10**9), ("m", 10**6), ("k", 10**3)):
        if bits_per_second >= scale:
            value = bits_per_second / scale
            return (
                f"{value:.0f}{prefix}bit" if abs(value - round(value)) < 0.05 else f"{value:.1f}{prefix}bit"
            )
    return f"{bits_per_second:.0f}bit"
