"""The training state a peer holds, as one list of tensors with a fixed layout.

Parameters (in ``named_parameters`` order), then the optimizer's per-parameter state, then
floating-point buffers (batch-norm running statistics). The layout is the same on every peer of a
task, so the list can be served to late joiners by hivemind's state sharing and checkpointed.

The first two parts are the *consensus* state: every peer applies the same optimizer step from the
same averaged gradient, so they are bit-identical across the swarm, and :func:`digest` of the first
:func:`consensus_count` tensors checks it. Batch-norm statistics are not: each peer updates them
from its own data shard, and a sub-network's statistics are recalibrated before it is evaluated
anyway (the once-for-all practice).

The optimizer state is created up front with the values a fresh optimizer would start from (zero
momentum and moments, step 0), so the layout exists before the first step and the first step behaves
exactly as it would on a fresh optimizer (SGD without dampening, AdamW).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import torch
from torch import nn

_SGD_KEYS = ("momentum_buffer",)
_ADAM_KEYS = ("exp_avg", "exp_avg_sq", "step")


def init_optimizer_state(net: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    for p in net.parameters():
        state = optimizer.state[p]
        if isinstance(optimizer, torch.optim.SGD):
            state.setdefault("momentum_buffer", torch.zeros_like(p, memory_format=torch.preserve_format))
        elif isinstance(optimizer, torch.optim.Adam | torch.optim.AdamW):
            state.setdefault("exp_avg", torch.zeros_like(p, memory_format=torch.preserve_format))
            state.setdefault("exp_avg_sq", torch.zeros_like(p, memory_format=torch.preserve_format))
            state.setdefault("step", torch.tensor(0.0))
        else:
            raise ValueError(f"optimizer: {type(optimizer).__name__} has no shared-state layout")


def _optimizer_keys(optimizer: torch.optim.Optimizer | str) -> tuple[str, ...]:
    """The per-parameter state keys of ``optimizer`` (an optimizer, or its name in a TrainConfig)."""
    if isinstance(optimizer, str):
        return _SGD_KEYS if optimizer == "sgd" else _ADAM_KEYS
    return _SGD_KEYS if isinstance(optimizer, torch.optim.SGD) else _ADAM_KEYS


def state_tensors(net: nn.Module, optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """Views of the live state (parameters, optimizer state, float buffers), in the fixed layout."""
    out = [p.data for p in net.parameters()]
    keys = _optimizer_keys(optimizer)
    for p in net.parameters():
        out += [optimizer.state[p][k] for k in keys]
    out += [b for b in net.buffers() if b.is_floating_point()]
    return out


def fresh_state_tensors(net: nn.Module, optimizer: str) -> list[torch.Tensor]:
    """What :func:`state_tensors` gives after :func:`init_optimizer_state` on a fresh optimizer named
    ``optimizer`` (``TrainConfig.optimizer``), without making one: a peer's agent only holds the
    state's layout, and making a torch optimizer imports ``torch._dynamo`` (seconds of CPU)."""
    params = list(net.parameters())
    out = [p.data for p in params]
    for p in params:
        for key in _optimizer_keys(optimizer):
            fresh = (
                torch.tensor(0.0)
                if key == "step"
                else torch.zeros_like(p, memory_format=torch.preserve_format)
            )
            out.append(fresh)
    out += [b for b in net.buffers() if b.is_floating_point()]
    return out


def consensus_count(net: nn.Module, optimizer: torch.optim.Optimizer | str) -> int:
    """How many leading tensors of :func:`state_tensors` every peer holds identically."""
    n = sum(1 for _ in net.parameters())
    return n * (1 + len(_optimizer_keys(optimizer)))


def load_state_tensors(net: nn.Module, optimizer: torch.optim.Optimizer, tensors: list[torch.Tensor]) -> None:
    live = state_tensors(net, optimizer)
    if len(live) != len(tensors) or any(a.shape != b.shape for a, b in zip(live, tensors)):
        raise ValueError("state: the received state does not match this task's model")
    with torch.no_grad():
        for dst, src in zip(live, tensors):
            dst.copy_(src)


def tensor_hashes(tensors: Sequence[torch.Tensor]) -> list[bytes]:
    """SHA-256 of each tensor's exact bytes: the state's *index*, which :func:`digest` hashes."""
    return [
        hashlib.sha256(t.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().data).digest()
        for t in tensors
    ]


def digest_of_index(index: Sequence[bytes]) -> str:
    """The :func:`digest` of the tensors whose :func:`tensor_hashes` are ``index``."""
    return hashlib.sha256(b"".join(index)).hexdigest()


def digest(tensors: Sequence[torch.Tensor]) -> str:
    """SHA-256 of the tensors' :func:`tensor_hashes` (bit-identical tensors <=> equal digests); what
    receipts carry. Two levels, so whoever holds the index checks any of the tensors on their own."""
    return digest_of_index(tensor_hashes(tensors))
