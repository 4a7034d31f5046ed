"""The exact all-reduce between real hivemind averager processes on 127.0.0.1: a pair whose members
end the stream exchange in an unlucky order still both finish with the same bits."""

from __future__ import annotations

import asyncio

import torch

from hivemind_adapter.allreduce import VerifiedAverager
from hivemind_adapter.exact_runner import ExactAllReduceRunner
from tests.hivemind_adapter.averager_pair import step_pair


class _SlowToReadTheEnd(ExactAllReduceRunner):
    """A reducer that, after its last reply to a sender, takes a second before it reads that sender's
    end of stream: by then the sender, holding every reply, has closed its side."""

    async def _accumulate_parts_streaming(self, stream, sender_index):
        replies = 0
        async for message in super()._accumulate_parts_streaming(stream, sender_index):
            yield message
            replies += 1
            if replies == self.tensor_part_reducer.num_parts:
                await asyncio.sleep(1.0)


class _SlowAverager(VerifiedAverager):
    runner_type = _SlowToReadTheEnd


# hivemind names a servicer's RPC handlers after its class: both members must answer as the same one.
_SlowAverager.__name__ = VerifiedAverager.__name__


def _tensors(seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(200_000, generator=g), torch.randn(17, generator=g)]


def test_a_sender_that_closes_before_the_reducer_read_its_end_is_not_a_drop_out():
    results, outcomes, _ = step_pair(_SlowAverager, _tensors, 60, prefix="exact-pair")
    assert not any(isinstance(o, Exception) for o in outcomes), outcomes
    want = [(a + b) / 2 for a, b in zip(_tensors(0), _tensors(1))]
    assert all(torch.equal(a, b) for a, b in zip(*results)), "the members must hold the same bits"
    for got, expected in zip(results[0], want):
        torch.testing.assert_close(got, expected)
