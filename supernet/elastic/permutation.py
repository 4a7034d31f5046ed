"""Channel reorderings: permute tensors in place, record what moved, and replay it on optimizer state."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

__all__ = ["Permutation", "permute_in_place", "permute_optimizer_state"]

Permutation = tuple[nn.Parameter | torch.Tensor, int, torch.Tensor]
"""A record of one reordering: (tensor, dim, index) — ``tensor`` was replaced by ``tensor.index_select(dim, index)``."""


@torch.no_grad()
def permute_in_place(tensor: torch.Tensor, dim: int, index: torch.Tensor, record: list[Permutation]) -> None:
    """Replace ``tensor`` by ``tensor.index_select(dim, index)`` in place; append that to ``record``."""
    tensor.copy_(tensor.index_select(dim, index.to(tensor.device)))
    record.append((tensor, dim, index))


@torch.no_grad()
def permute_optimizer_state(optimizer: torch.optim.Optimizer, record: Sequence[Permutation]) -> None:
    """Apply channel reorderings to an optimizer's per-parameter state (momentum, Adam moments).

    Every state tensor of a reordered parameter that has the parameter's shape is permuted the same
    way, so training continues exactly as if the channels had always been in the new order.
    """
    for tensor, dim, index in record:
        state = optimizer.state.get(tensor)
        if not state:
            continue
        for value in state.values():
            if isinstance(value, torch.Tensor) and value.shape == tensor.shape:
                value.copy_(value.index_select(dim, index.to(value.device)))
