"""What a member checks in a reducer's reply before it takes it (robust averaging).

A reducer decides its part's result for every member alike: a lying one would otherwise have its
result applied by all of them, with digests that agree, and no later check could tell. Each member
knows one thing about the honest result: the part it sent is in it. That bounds the result's length
and its direction against the member's part; a reply outside those bounds is refused.
"""

from __future__ import annotations

import math

import torch

# A member doubts a reducer's reply (robust averaging) when its norm exceeds this many times the
# norm of the member's own part. A robust centre lies within the hull of the parts, so it is no
# longer than the longest; a part is a per-sample mean, whose noise shrinks with the square root of
# its samples, so an honest member's part is 50x shorter than a centre only if it had thousands of
# times the others' samples.
REPLY_NORM_FACTOR = 50.0
# An honest centre contains the member's own part and the others' mean, whose cosine with that part
# stays above this bound on part-sized vectors, so a reply below it is not an honest centre. A
# reducer that negates the centre falls below it only where the centre leans clearly toward the
# member's part (small groups, strong signal): a subtle liar passes this check, a blatant one does not.
LOWEST_HONEST_ALIGNMENT = -0.6
# Parts shorter than this are not judged by direction: their cosines scatter past the bound.
MIN_VALUES_FOR_DIRECTION = 32768


def implausible_reply(own: torch.Tensor, reply: torch.Tensor, min_values: int = 1024) -> str | None:
    """Why a reducer's ``reply`` (the robust centre of one part) cannot be an honest centre of a part
    this member sent as ``own``, or None. A reducer controls its part's result for every member, so
    a lying one would otherwise be applied by all of them alike (and their digests would agree).
    Parts of fewer than ``min_values`` values, and parts this member sent as zeros (a broadcast's
    followers) or not finite, are not judged."""
    if own.numel() < min_values:
        return None
    own64, reply64 = own.detach().reshape(-1).double(), reply.detach().reshape(-1).double()
    own_norm = float(torch.linalg.vector_norm(own64))
    if own_norm == 0 or not math.isfinite(own_norm):
        return None
    reply_norm = float(torch.linalg.vector_norm(reply64))
    if not math.isfinite(reply_norm):
        return "not finite"
    if reply_norm > REPLY_NORM_FACTOR * own_norm:
        return f"{reply_norm / own_norm:.0f}x the length of this member's part"
    if own.numel() >= MIN_VALUES_FOR_DIRECTION and reply_norm > 0:
        cosine = float(torch.dot(own64, reply64)) / (own_norm * reply_norm)
        if cosine < LOWEST_HONEST_ALIGNMENT:
            return f"against this member's part (cosine {cosine:.2f})"
    return None


def reply_cosine(own: torch.Tensor, reply: torch.Tensor, min_values: int = 1024) -> float | None:
    """The cosine between a part this member sent as ``own`` and the reducer's ``reply``, or None
    where it says nothing (a short part, a zero or non-finite one). One part's cosine is noisy; kept
    across all-reduces (:class:`~robust_aggregation.alignment.AlignmentRecord`), it tells a reducer that
    keeps pointing its results against the members' parts, which no single reply shows."""
    if own.numel() < min_values:
        return None
    own64, reply64 = own.detach().reshape(-1).double(), reply.detach().reshape(-1).double()
    norms = float(torch.linalg.vector_norm(own64)) * float(torch.linalg.vector_norm(reply64))
    if norms == 0 or not math.isfinite(norms):
        return None
    return float(torch.dot(own64, reply64)) / norms
