"""A short fingerprint of a gradient that survives floating-point noise: a fixed random projection.

A peer commits, in its signed receipt, to ``k`` numbers: the projections of its mean gradient on ``k``
random ±1 vectors drawn from a seed everybody knows (the task seed and the round). An auditor who
recomputes the gradient from the same state, samples and sub-networks gets the same projections up
to rounding differences between machines (summation order, thread counts, CPU against GPU), which
are orders of magnitude below what any fabricated or rescaled gradient changes. A SHA-256 of the
bytes cannot be compared with a tolerance; this can.

The projections are sent as integers (value x 10^9, rounded) so the signed record has one exact
encoding.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from supernet.config import derive_seed

SKETCH_SIZE = 16
SKETCH_SCALE = 1e9
SIGN_BITS = 16  # bits of one random word: the most projections a sketch has
WORDS = 1 << SIGN_BITS  # the distinct random words


def sketch_seed(task_seed: int, round_index: int) -> int:
    return derive_seed("gradient-sketch", task_seed, round_index) % (2**63)


def gradient_sketch(tensors: Sequence[torch.Tensor], seed: int, k: int = SKETCH_SIZE) -> list[float]:
    """``k`` projections of the concatenated ``tensors`` on random ±1 vectors fixed by ``seed``.

    Element ``i``'s signs are the ``k`` bits of one random word: one draw per element, not ``k``
    (a k x n sign matrix would cost ``k`` draws per element, every round of every peer and every
    audit). A projection is ``2 * (sum of the elements whose bit is set) - (sum of all)``; elements
    are first summed by their word (float64), so the bits are expanded once per word, not per element."""
    if not 0 < k <= SIGN_BITS:
        raise ValueError(f"a sketch has 1 to {SIGN_BITS} projections")
    generator = torch.Generator().manual_seed(seed)
    values = [t.detach().to("cpu", torch.float64).reshape(-1) for t in tensors]
    words = [torch.randint(0, WORDS, (v.numel(),), generator=generator, dtype=torch.int32) for v in values]
    by_word = torch.bincount(torch.cat(words), weights=torch.cat(values), minlength=WORDS)
    bits = torch.tensor([1 << j for j in range(k)], dtype=torch.int32)
    set_bits = (torch.arange(WORDS, dtype=torch.int32)[:, None] & bits) != 0  # WORDS x k
    out = 2.0 * (by_word @ set_bits.to(torch.float64)) - by_word.sum()
    return out.tolist()


def encode_sketch(values: Sequence[float]) -> tuple[int, ...]:
    """Integers for the receipt; raises ValueError for a non-finite value (a broken gradient)."""
    if not all(math.isfinite(v) for v in values):
        raise ValueError("the gradient sketch is not finite")
    return tuple(int(round(v * SKETCH_SCALE)) for v in values)


def decode_sketch(values: Sequence[int]) -> list[float]:
    return [v / SKETCH_SCALE for v in values]


def sketch_distance(claimed: Sequence[float], recomputed: Sequence[float]) -> float:
    """Relative L2 distance of two sketches (0 = equal); what an audit compares with its tolerance."""
    a = torch.tensor(list(claimed), dtype=torch.float64)
    b = torch.tensor(list(recomputed), dtype=torch.float64)
    if a.shape != b.shape:
        return math.inf
    return float((a - b).norm() / b.norm().clamp_min(1e-12))
