"""A sender of a part whose stream ends while it waits for the part's result (its task cancelled)
leaves that result to the part's other senders, the member's own sender included, with both
reducers. Before, the cancelled waiter cancelled the shared result: the robust reducer's member
then lost its own sender silently and its all-reduce waited for its own part until the step's bound
(seen with 16 peers and churn); the plain reducer raised on the next sender of the part."""

from __future__ import annotations

import asyncio

import torch

from hivemind_adapter.finite_reduce import FiniteMeanReducer
from hivemind_adapter.robust_reduce import RobustPartReducer
from robust_aggregation.centered_clip import RobustConfig

SHAPES = [torch.Size([64])] * 2  # two parts, so that the reducer has a next part to move on to


def _parts(seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(64, generator=g)
    return [base + 0.1 * torch.randn(64, generator=g) for _ in range(2)]


def test_a_robust_part_reduced_while_one_sender_is_cancelled_reaches_the_other():
    async def scenario():
        reducer = RobustPartReducer(SHAPES, 2, RobustConfig())
        parts = _parts(0)
        leaving = asyncio.create_task(reducer.accumulate_part(0, 0, parts[0]))
        own = asyncio.create_task(reducer.accumulate_part(1, 0, parts[1]))
        await asyncio.sleep(0)  # both held: the centre is being computed in a worker thread
        await asyncio.sleep(0)
        assert reducer._reducing is not None and not own.done()
        leaving.cancel()  # its stream ended (the runner's handler is cancelled)
        reducer.on_sender_failed(0)
        result = await asyncio.wait_for(own, 5)
        return reducer, parts, result, leaving

    reducer, parts, result, leaving = asyncio.run(scenario())
    assert leaving.cancelled()
    assert result.shape == SHAPES[0] and bool(torch.isfinite(result).all())
    assert reducer.current_part_index == 1  # and the reducer moved on to the next part
    # the centre of what both sent (the leaving sender's part was in before it left)
    assert torch.allclose(result, (parts[0] + parts[1]) / 2, atol=0.05)


def test_a_plain_part_whose_first_sender_is_cancelled_waiting_is_reduced_for_the_other():
    async def scenario():
        reducer = FiniteMeanReducer(SHAPES, 2)
        parts = _parts(1)
        leaving = asyncio.create_task(reducer.accumulate_part(0, 0, parts[0]))
        await asyncio.sleep(0)  # in, and waiting for the other sender
        leaving.cancel()
        await asyncio.sleep(0)
        reducer.on_sender_failed(0)  # after its part 0: it still counts in part 0
        result = await asyncio.wait_for(reducer.accumulate_part(1, 0, parts[1]), 5)
        return reducer, parts, result, leaving

    reducer, parts, result, leaving = asyncio.run(scenario())
    assert leaving.cancelled()
    torch.testing.assert_close(result, (parts[0] + parts[1]) / 2)
    assert reducer.current_part_index == 1
