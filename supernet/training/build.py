"""The classification supernet a :class:`~supernet.training.config.TrainConfig` describes."""

from __future__ import annotations

import torch

from supernet.classification import ClassificationSupernet
from supernet.config import derive_seed
from supernet.init import build_initialised
from supernet.training.config import TrainConfig

__all__ = ["build_supernet"]


def build_supernet(cfg: TrainConfig, num_classes: int, in_channels: int) -> ClassificationSupernet:
    """The supernet ``cfg`` describes, with initial weights drawn from a generator seeded by
    ``cfg.seed`` (:func:`supernet.init.build_initialised`: torch's global generator is neither read
    nor advanced, so builds in concurrent threads give the same weights)."""
    generator = torch.Generator().manual_seed(derive_seed("init", cfg.seed) % (2**63))
    net = build_initialised(
        lambda: ClassificationSupernet(
            num_classes,
            in_channels,
            cfg.space(),
            width_mult=cfg.width_mult,
            stem_channels=cfg.stem_channels,
            unit_channels=cfg.unit_channels,
            head_channels=cfg.head_channels,
            channel_divisor=cfg.channel_divisor,
            activations=cfg.activations,
            stem_stride=cfg.stem_stride,
            dropout=cfg.dropout,
            kernel_transform=cfg.kernel_transform,
        ),
        generator,
    )
    return net.to(cfg.device)
