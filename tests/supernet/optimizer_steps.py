"""Run in a fresh interpreter (``python -m tests.supernet.optimizer_steps sgd|adamw``): three steps of
MANTA's optimizer (``supernet.training.optimizer``) on a small net, then the same three of torch's own
``optimizer.step()`` on an identical one; prints JSON with both digests (parameters and optimizer
state) and whether ``torch._dynamo`` was imported before torch's own steps ran."""

from __future__ import annotations

import hashlib
import json
import sys

import torch

from supernet.state import init_optimizer_state, state_tensors
from supernet.training.config import TrainConfig
from supernet.training.optimizer import lr_at, make_optimizer, optimizer_step


def _net() -> torch.nn.Module:
    torch.manual_seed(5)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.Flatten(), torch.nn.Linear(8 * 6 * 6, 4)
    )


def _run(cfg: TrainConfig, torchs_own: bool) -> str:
    net = _net()
    optimizer = make_optimizer(net, cfg)
    init_optimizer_state(net, optimizer)
    generator = torch.Generator().manual_seed(11)
    for step in range(3):
        for p in net.parameters():
            p.grad = torch.randn(p.shape, generator=generator)
        if torchs_own:
            for group in optimizer.param_groups:
                group["lr"] = lr_at(step, cfg)
            optimizer.step()
        else:
            optimizer_step(net, optimizer, step, cfg)
    return hashlib.sha256(
        b"".join(t.detach().numpy().tobytes() for t in state_tensors(net, optimizer))
    ).hexdigest()


def main() -> None:
    cfg = TrainConfig(optimizer=sys.argv[1], weight_decay=1e-4, warmup_steps=2)
    ours = _run(cfg, torchs_own=False)
    dynamo = "torch._dynamo" in sys.modules
    print(json.dumps({"ours": ours, "dynamo_imported": dynamo, "torchs": _run(cfg, torchs_own=True)}))


if __name__ == "__main__":
    main()
