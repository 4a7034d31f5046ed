"""The one-sided horizontal correlation of left and right features, and the cost features it builds."""

from __future__ import annotations

import torch

__all__ = ["correlation_1d", "correlation_1d_loop", "with_cost"]


def correlation_1d(left: torch.Tensor, right: torch.Tensor, max_displacement: int) -> torch.Tensor:
    """One-sided horizontal correlation: B×C×H×W, B×C×H×W → B×(D+1)×H×W.

    ``out[:, d, y, x] = mean_c left[:, c, y, x] * right[:, c, y, x - d]``, zero where ``x - d < 0``.
    All pairs of a row in one matrix product (B·H·W² multiply-adds per channel), then the D + 1
    diagonals are gathered.
    """
    batch, channels, height, width = left.shape
    rows_left = left.permute(0, 2, 3, 1)  # B, H, W, C
    rows_right = right.permute(0, 2, 1, 3)  # B, H, C, W
    pairs = torch.matmul(rows_left, rows_right) / channels  # B, H, W(x), W(x')
    x = torch.arange(width, device=left.device)
    d = torch.arange(max_displacement + 1, device=left.device)
    index = x.unsqueeze(1) - d.unsqueeze(0)  # W, D+1: x - d
    inside = (index >= 0).to(pairs.dtype)
    index = index.clamp(min=0).expand(batch, height, width, max_displacement + 1)
    cost = torch.gather(pairs, 3, index) * inside
    return cost.permute(0, 3, 1, 2).contiguous()


def correlation_1d_loop(left: torch.Tensor, right: torch.Tensor, max_displacement: int) -> torch.Tensor:
    """The same correlation with a Python loop over displacements (reference for tests and benchmarks)."""
    out = left.new_zeros(left.shape[0], max_displacement + 1, *left.shape[2:])
    width = left.shape[-1]
    for d in range(min(max_displacement, width - 1) + 1):
        out[:, d, :, d:] = (left[..., d:] * right[..., : width - d]).mean(1)
    return out


def with_cost(x: torch.Tensor, batch: int, max_displacement: int) -> torch.Tensor:
    """Left features (the first ``batch`` of a siamese batch) joined with their correlation to the right."""
    left = x[:batch]
    return torch.cat([left, correlation_1d(left, x[batch:], max_displacement)], 1)
