"""Sizes: channel widths rounded to a divisor, and the output size of a convolution."""

from __future__ import annotations

__all__ = ["make_divisible", "conv_output_size"]


def make_divisible(value: float, divisor: int = 8, min_value: int | None = None) -> int:
    """Round ``value`` to a multiple of ``divisor`` (at least ``min_value``, default ``divisor``), never
    more than 10 % down. Raises ``ValueError`` if ``divisor`` is below 1."""
    if divisor < 1:
        raise ValueError(f"channel_divisor: {divisor} is not a positive integer")
    min_value = divisor if min_value is None else min_value
    rounded = max(min_value, int(value + divisor / 2) // divisor * divisor)
    if rounded < 0.9 * value:
        rounded += divisor
    return int(rounded)


def conv_output_size(size: int, kernel_size: int, stride: int, padding: int | None = None) -> int:
    """The output length, along one axis, of a convolution over ``size`` inputs (padding: ``k // 2``)."""
    padding = kernel_size // 2 if padding is None else padding
    return (size + 2 * padding - kernel_size) // stride + 1
