"""The elastic linear layer: prefix-sliced input features (optionally fewer outputs)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from supernet.elastic.masks import Masks, full_masks

__all__ = ["ElasticLinear"]


class ElasticLinear(nn.Linear):
    """A linear layer over the first ``x.shape[-1]`` input features (optionally fewer outputs)."""

    def forward(self, x: torch.Tensor, out_features: int | None = None) -> torch.Tensor:
        out_features = self.out_features if out_features is None else out_features
        bias = None if self.bias is None else self.bias[:out_features]
        return F.linear(x, self.weight[:out_features, : x.shape[-1]], bias)

    @torch.no_grad()
    def export(self, in_features: int, out_features: int | None = None) -> nn.Linear:
        out_features = self.out_features if out_features is None else out_features
        linear = nn.Linear(  # on meta: no draws from torch's global generator, the weights are copied
            in_features, out_features, bias=self.bias is not None, device="meta", dtype=self.weight.dtype
        ).to_empty(device=self.weight.device)
        linear.weight.copy_(self.weight[:out_features, :in_features])
        if self.bias is not None:
            linear.bias.copy_(self.bias[:out_features])
        return linear

    def parameter_masks(self, in_features: int, out_features: int | None = None) -> Masks:
        out_features = self.out_features if out_features is None else out_features
        masks = full_masks(self, False)
        masks["weight"][:out_features, :in_features] = True
        if self.bias is not None:
            masks["bias"][:out_features] = True
        return masks

    def macs(self, in_features: int, out_features: int | None = None) -> int:
        return in_features * (self.out_features if out_features is None else out_features)
