"""The training state's fixed layout (supernet/state.py)."""

from __future__ import annotations

import pytest
import torch

from supernet.state import consensus_count, fresh_state_tensors, init_optimizer_state, state_tensors
from supernet.workload import workload_for
from tests.helpers import modules_loaded_by


@pytest.mark.parametrize(
    "task, optimizer", [("digits", "sgd"), ("digits", "adamw"), ("stereo-synthetic", "adamw")]
)
def test_the_fresh_layout_is_what_a_fresh_optimizer_gives(task, optimizer):
    # A peer's agent builds its shared state without a torch optimizer; its workers load that state
    # into theirs, so the two must agree tensor for tensor.
    workload = workload_for(task, {"optimizer": optimizer})
    net = workload.build()
    torch_optimizer = workload.make_optimizer(net)
    init_optimizer_state(net, torch_optimizer)
    expected = state_tensors(net, torch_optimizer)
    fresh = fresh_state_tensors(net, optimizer)
    assert len(fresh) == len(expected)
    for got, want in zip(fresh, expected, strict=True):
        assert got.shape == want.shape and got.dtype == want.dtype and got.stride() == want.stride()
        assert torch.equal(got, want)
    assert consensus_count(net, optimizer) == consensus_count(net, torch_optimizer)


def test_the_agents_state_needs_no_torch_optimizer():
    code = (
        "from supernet.workload import workload_for; from supernet.state import fresh_state_tensors; "
        "w = workload_for('digits'); fresh_state_tensors(w.build(), w.cfg.optimizer)"
    )
    assert modules_loaded_by(code, ("torch._dynamo",)) == [], "it imported torch._dynamo (1.7 s of CPU)"
