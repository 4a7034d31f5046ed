"""Parameter masks: for each parameter name, a bool tensor of the elements a sub-network uses."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["Masks", "prefix_masks", "full_masks"]

Masks = dict[str, torch.Tensor]


def prefix_masks(prefix: str, masks: Masks) -> Masks:
    """``masks`` with every name prefixed by ``prefix.`` (a child module's masks, named as its parent's)."""
    return {f"{prefix}.{name}": mask for name, mask in masks.items()}


def full_masks(module: nn.Module, value: bool = True) -> Masks:
    """A mask for every parameter of ``module``, all ``value``."""
    return {name: torch.full(p.shape, value, dtype=torch.bool) for name, p in module.named_parameters()}
