"""A sender that fails part-way does not hold the honest members' all-reduce to its bound (real
hivemind averagers on 127.0.0.1, as a known group of three): one that closes its stream to a reducer
early leaves every member with a partial all-reduce at once; one that stops reading a reducer's
replies (its own all-reduce broke, its parts still going out) leaves the others' average whole."""

from __future__ import annotations

import asyncio

import torch

from hivemind_adapter.allreduce import PartialAllReduceError, VerifiedAverager
from hivemind_adapter.exact_runner import ExactAllReduceRunner
from tests.hivemind_adapter.averager_group import ALLREDUCE_TIMEOUT, step_known_group


def _first_other(runner: ExactAllReduceRunner):
    return next(p for p in runner.ordered_peer_ids if p != runner.peer_id)


class _StopsSendingToOneReducer(ExactAllReduceRunner):
    """Sends the first reducer other than itself only its first part, then closes that stream."""

    async def _generate_input_for_peer(self, peer_index: int):
        target = self.ordered_peer_ids.index(_first_other(self))
        sent = 0
        async for message in super()._generate_input_for_peer(peer_index):
            if peer_index == target and sent == 1:
                return
            yield message
            sent += 1


class _StopsReadingOneReducer(ExactAllReduceRunner):
    """Reads the first reducer other than itself's first reply only (its parts all go out)."""

    async def _exchange_with_reducer(self, peer_id) -> None:
        if peer_id != _first_other(self):
            return await super()._exchange_with_reducer(peer_id)
        inputs = self._generate_input_for_peer(self.ordered_peer_ids.index(peer_id))
        replies = await self._get_peer_stub(peer_id).rpc_aggregate_part(inputs)
        await anext(replies)
        await asyncio.sleep(3600)


class _DroppingAverager(VerifiedAverager):
    runner_type = _StopsSendingToOneReducer


class _StallingAverager(VerifiedAverager):
    runner_type = _StopsReadingOneReducer


# hivemind names a servicer's RPC handlers after its class: the failing member answers as the others do.
_DroppingAverager.__name__ = _StallingAverager.__name__ = VerifiedAverager.__name__


def _small(seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(300_000, generator=g)]  # several 64 KB parts per reducer's shard


def _large(seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(3_000_000, generator=g)]  # replies to one sender beyond what the streams buffer


def test_a_sender_that_closes_its_stream_part_way_leaves_a_partial_all_reduce_at_once():
    _, outcomes, _, peer_ids = step_known_group(
        3,
        _small,
        averager_type=lambda i: _DroppingAverager if i == 2 else VerifiedAverager,
        prefix="drop-out",
    )
    hurt = peer_ids.index(next(p for p in sorted(peer_ids) if p != peer_ids[2]))
    # it breaks on the drop-out, named as such, not on the bound of ALLREDUCE_TIMEOUT s
    assert isinstance(outcomes[hurt], PartialAllReduceError), (ALLREDUCE_TIMEOUT, repr(outcomes[hurt]))
    assert "dropped out" in str(outcomes[hurt]), outcomes[hurt]
    assert all(isinstance(o, Exception) for o in outcomes), outcomes  # nobody holds a partial result


def test_a_sender_that_stops_reading_its_replies_leaves_the_others_average_whole():
    results, outcomes, _, peer_ids = step_known_group(
        3, _large, averager_type=lambda i: _StallingAverager if i == 2 else VerifiedAverager, prefix="stall"
    )
    assert outcomes[0] is None and outcomes[1] is None, [repr(o) for o in outcomes]
    assert isinstance(outcomes[2], Exception)  # its own all-reduce waits on the replies it left unread
    assert torch.equal(results[0][0], results[1][0]), "the members must hold the same bits"
    torch.testing.assert_close(results[0][0], sum(_large(i)[0] for i in range(3)) / 3)
