"""The exact all-reduce between real hivemind averager processes on 127.0.0.1: a pair whose members
end the stream exchange in an unlucky order still both finish with the same bits."""

from __future__ import annotations

import asyncio
import threading

import torch

from hivemind_adapter.allreduce import ExactAllReduceRunner, VerifiedAverager
from hivemind_adapter.dht import start_dht, visible_maddrs

LOOPBACK = ["/ip4/127.0.0.1/tcp/0"]


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
    first_dht = start_dht(host_maddrs=LOOPBACK)
    second_dht = start_dht(host_maddrs=LOOPBACK, initial_peers=visible_maddrs(first_dht))
    common = dict(
        prefix="exact-pair", target_group_size=2, min_group_size=2, min_matchmaking_time=2.0,
        request_timeout=1.0, next_chunk_timeout=5.0, allreduce_timeout=60.0, part_size_bytes=64 * 1024,
        start=True,
    )  # fmt: skip
    averagers = [
        _SlowAverager(_tensors(0), first_dht, **common),
        _SlowAverager(_tensors(1), second_dht, **common),
    ]
    outcomes: list[object] = [None, None]

    def step(i: int) -> None:
        try:
            outcomes[i] = averagers[i].step(timeout=60, allow_retries=False)
        except Exception as e:  # the outcome under test: a member whose all-reduce failed
            outcomes[i] = e

    try:
        threads = [threading.Thread(target=step, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert not any(t.is_alive() for t in threads), "a step did not end within its bounds"
        assert not any(isinstance(o, Exception) for o in outcomes), outcomes
        want = [(a + b) / 2 for a, b in zip(_tensors(0), _tensors(1))]
        results = []
        for averager in averagers:
            with averager.get_tensors() as tensors:
                results.append([t.clone() for t in tensors])
        assert all(torch.equal(a, b) for a, b in zip(*results)), "the members must hold the same bits"
        for got, expected in zip(results[0], want):
            torch.testing.assert_close(got, expected)
    finally:
        for averager in averagers:
            averager.shutdown()
        second_dht.shutdown()
        first_dht.shutdown()
