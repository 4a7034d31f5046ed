"""Supernet checkpoints: one file that rebuilds the trained supernet, its optimizer and its place in
the schedule, for resuming a swarm run and for search/export.

Format (a ``torch.save`` dict, loaded with ``weights_only=True``, so a checkpoint cannot run code)::

    format        "manta-supernet-checkpoint"
    version       1
    task          built-in task name ("digits", "stereo-synthetic", ...)
    family        "classification" | "stereo"
    train_config  the TrainConfig fields (plain JSON values)
    round         the round (optimizer step) the state is the result of; -1 for the initial state
    digest        SHA-256 of the consensus part of ``state`` (supernet.state.digest)
    state         the state tensors in supernet.state's layout (parameters, optimizer state, buffers)
    meta          anything else JSON-able (task id, attempt, wall time, ...)

Files are written to a temporary name and renamed, so a reader never sees half a checkpoint.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from supernet.state import consensus_count, digest, init_optimizer_state, load_state_tensors, state_tensors
from supernet.workload import Workload, family_of, workload_for

__all__ = [
    "CheckpointError",
    "LoadedCheckpoint",
    "load_checkpoint",
    "read_checkpoint",
    "save_checkpoint",
    "save_trained",
]

FORMAT = "manta-supernet-checkpoint"
VERSION = 1


class CheckpointError(ValueError):
    """The file is not a usable MANTA checkpoint (one line saying why)."""


@dataclass
class LoadedCheckpoint:
    workload: Workload
    net: nn.Module
    optimizer: torch.optim.Optimizer
    round: int
    digest: str
    meta: dict[str, Any] = field(default_factory=dict)


def save_checkpoint(
    path: str | Path,
    workload: Workload,
    state: list[torch.Tensor],
    round_index: int,
    *,
    meta: dict[str, Any] | None = None,
) -> Path:
    """Write ``state`` (supernet.state layout) of ``workload`` after ``round_index``; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    net = workload.build()
    # by the optimizer's name: making a torch optimizer imports torch._dynamo, which costs a peer's exit
    # seconds of CPU (its process never makes one: its workers train)
    consensus = consensus_count(net, workload.cfg.optimizer)
    payload = {
        "format": FORMAT,
        "version": VERSION,
        "task": workload.cfg.task,
        "family": workload.family,
        "train_config": workload.cfg.to_dict(),
        "round": int(round_index),
        "digest": digest(state[:consensus]),
        "state": [t.detach().cpu().clone() for t in state],
        "meta": dict(meta or {}),
    }
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    torch.save(payload, tmp)
    os.replace(tmp, path)
    return path


def save_trained(
    path: str | Path,
    workload: Workload,
    net: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    round_index: int = -1,
    meta: dict[str, Any] | None = None,
) -> Path:
    """Checkpoint a supernet trained in this process (``optimizer`` optional: fresh state if absent)."""
    if optimizer is None:
        optimizer = workload.make_optimizer(net)
    init_optimizer_state(net, optimizer)
    return save_checkpoint(path, workload, state_tensors(net, optimizer), round_index, meta=meta)


def read_checkpoint(path: str | Path) -> dict[str, Any]:
    """The raw checkpoint dict, after checking it is one (format, version, fields)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # pickle, zip and torch errors all mean "not a checkpoint"
        raise CheckpointError(f"{path} is not a MANTA checkpoint ({type(e).__name__})") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a MANTA supernet checkpoint")
    if payload.get("version") != VERSION:
        raise CheckpointError(
            f"{path} is checkpoint version {payload.get('version')!r}; this MANTA reads version {VERSION}"
        )
    missing = {"task", "family", "train_config", "round", "digest", "state"} - payload.keys()
    if missing:
        raise CheckpointError(f"{path} lacks {', '.join(sorted(missing))}")
    if payload["family"] != family_of(payload["task"]):
        raise CheckpointError(f"{path}: family {payload['family']!r} does not match task {payload['task']!r}")
    return payload


def load_checkpoint(path: str | Path, *, task=None) -> LoadedCheckpoint:
    """Rebuild the supernet and optimizer a checkpoint describes, with its state loaded and checked.

    ``task`` may pass an already loaded :class:`tasks.Task` (saves loading the dataset twice).
    """
    payload = read_checkpoint(path)
    try:
        workload = workload_for(payload["task"], payload["train_config"], task=task)
    except (ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"{path}: its training configuration is not usable here: {e}") from None
    net = workload.build()
    optimizer = workload.make_optimizer(net)
    init_optimizer_state(net, optimizer)
    try:
        load_state_tensors(net, optimizer, payload["state"])
    except ValueError:
        raise CheckpointError(f"{path}: its state does not match the {payload['task']} supernet") from None
    consensus = consensus_count(net, optimizer)
    tensors = state_tensors(net, optimizer)[:consensus]
    state_digest = digest(tensors)
    if payload["digest"] not in (state_digest, _flat_digest(tensors)):
        raise CheckpointError(f"{path}: its state does not match its digest (corrupted)")
    return LoadedCheckpoint(
        workload, net, optimizer, int(payload["round"]), state_digest, dict(payload.get("meta", {}))
    )


def _flat_digest(tensors: list[torch.Tensor]) -> str:
    """The digest checkpoints carried before 2026-11-28: SHA-256 of the tensors' bytes, concatenated."""
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().data)
    return h.hexdigest()
