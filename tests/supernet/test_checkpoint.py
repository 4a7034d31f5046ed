"""Checkpoint files: the state checked against its digest on load, and files written before the
two-level digest still loading (their flat digest checked instead)."""

from __future__ import annotations

import hashlib

import pytest
import torch

from supernet.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from supernet.state import consensus_count, digest, init_optimizer_state, state_tensors
from supernet.workload import workload_for

SMALL = dict(width_mult=0.25, head_channels=64, channel_divisor=4)


def _written(tmp_path):
    workload = workload_for("digits", SMALL)
    net = workload.build()
    optimizer = workload.make_optimizer(net)
    init_optimizer_state(net, optimizer)
    state = [t.detach().clone() for t in state_tensors(net, optimizer)]
    path = save_checkpoint(tmp_path / "round-00000003.pt", workload, state, 3)
    return path, state[: consensus_count(net, optimizer)]


def test_a_checkpoint_loads_with_its_digest_and_a_changed_state_is_refused(tmp_path):
    path, consensus = _written(tmp_path)
    loaded = load_checkpoint(path)
    assert (loaded.round, loaded.digest) == (3, digest(consensus))
    payload = torch.load(path, weights_only=True)
    payload["state"][0] += 1e-3
    torch.save(payload, path)
    with pytest.raises(CheckpointError, match="does not match its digest"):
        load_checkpoint(path)


def test_a_checkpoint_with_the_flat_digest_of_before_still_loads(tmp_path):
    path, consensus = _written(tmp_path)
    flat = hashlib.sha256(
        b"".join(t.contiguous().view(-1).view(torch.uint8).numpy().tobytes() for t in consensus)
    )
    payload = torch.load(path, weights_only=True)
    payload["digest"] = flat.hexdigest()
    torch.save(payload, path)
    assert load_checkpoint(path).digest == digest(consensus)  # today's digest, recomputed
