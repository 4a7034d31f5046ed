"""How long each MANTA record may live in the DHT, and the check that holds a stored copy to it.

hivemind keeps, for each key and subkey, the copy that expires last, and nothing ties a copy's
expiration to its content: a record stored to expire in ten years would keep a dead peer in every
roster, and an old record re-stored with a later expiration would shadow its author's fresh one. So
each family has a lifetime counted from the time its author signed it, and every node's validator
refuses a copy that expires later than that (plus :data:`EXPIRY_SLACK_SECONDS`: both times come from
the author's clock) or whose signed time is ahead of the node's clock by more than
:data:`CLOCK_SLACK_SECONDS`. Their authors re-sign what they refresh.

Two families are re-stored unchanged and count from the time of the check instead: a task's spec (a
second aggregator re-stores it as its author signed it) and a ledger's checkpoint note (it carries no
time). Averaging declarations sign their own expiration; their readers compare it
(``hivemind_adapter.group_keys``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

EXPIRY_SLACK_SECONDS = 10.0  # from signing a record to storing it
CLOCK_SLACK_SECONDS = 60.0  # honest nodes' clocks differ by less than this

ANNOUNCE_TTL = 12.0  # an announcement not refreshed for this long drops out of the roster (a dead peer too)
PROGRESS_TTL = 30.0  # a peer that stopped reporting drops out of the round's sample count
COMMIT_TTL = 90.0  # a commit report (and a partner check's marker), at least
COMMIT_MAX_TTL = 600.0  # ... and at most (what validators accept)
# A commit report lives this many of its poster's rounds: the board must hold the last committed attempt
# while the next one runs (joiners and peers catching up read it then).
COMMIT_ROUNDS_KEPT = 2.5
CONVICTION_TTL = 6 * 3600.0  # a posted conviction (its poster re-signs and re-posts it at half of this)
PUBLISHED_TTL = 3600.0  # an aggregator's binding, checkpoint note and state anchor (refreshed well before)
DIRECTORY_TTL = 600.0  # a cohort directory's header: several epochs (each epoch signs a new one)
TASK_TTL = 3600.0  # a task's spec and its index entry, ahead of the time they are stored


@dataclass(frozen=True)
class Lifetime:
    """A record family's lifetime: ``seconds`` from ``signed_at(opened record)`` (seconds since the
    epoch), or from the time of the check where ``signed_at`` is None."""

    seconds: float
    signed_at: Callable[[Any], float] | None = None


def signed_seconds(sealed: Any) -> float:
    """The signed time of a sealed record whose ``timestamp`` is in milliseconds since the epoch."""
    return sealed.record.timestamp / 1000.0


def expiry_error(lifetime: Lifetime, opened: Any, expiration_time: float, now: float) -> str | None:
    """Why a stored copy (``opened``: the checked record, ``expiration_time``: its DHT expiration) is
    refused at ``now``, or None if its lifetime allows it."""
    if lifetime.signed_at is None:
        if expiration_time > now + lifetime.seconds + CLOCK_SLACK_SECONDS:
            return (
                f"expires {expiration_time - now:.0f} s from now; its family lives {lifetime.seconds:.0f} s"
            )
        return None
    signed = lifetime.signed_at(opened)
    if signed > now + CLOCK_SLACK_SECONDS:
        return f"signed {signed - now:.0f} s in the future"
    if expiration_time > signed + lifetime.seconds + EXPIRY_SLACK_SECONDS:
        return (
            f"expires {expiration_time - signed:.0f} s after it was signed; "
            f"its family lives {lifetime.seconds:.0f} s"
        )
    return None


def commit_ttl(round_seconds: float) -> float:
    """How long a peer's commit reports live once its rounds take ``round_seconds``:
    :data:`COMMIT_ROUNDS_KEPT` rounds, within [:data:`COMMIT_TTL`, :data:`COMMIT_MAX_TTL`]."""
    return min(COMMIT_MAX_TTL, max(COMMIT_TTL, COMMIT_ROUNDS_KEPT * round_seconds))
