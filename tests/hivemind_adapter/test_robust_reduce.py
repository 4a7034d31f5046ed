"""hivemind's reducer with a robust centre (hivemind_adapter.robust_reduce): its bookkeeping, and real
averagers in a group with one malicious member. CenteredClip on its own: tests/robust_aggregation."""

from __future__ import annotations

import asyncio
import math

import pytest
import torch

from hivemind_adapter.allreduce import (
    AllReduceBroke,
    AllreduceException,
    PartialAllReduceError,
    VerifiedAverager,
)
from hivemind_adapter.robust_reduce import RobustPartReducer
from robust_aggregation.centered_clip import (
    RobustConfig,
)
from tests.adversaries.dishonest_peer import lying_averager
from tests.hivemind_adapter.averager_group import step_known_group, step_known_group_repeatedly
from tests.hivemind_adapter.averager_pair import step_pair

CONFIG = RobustConfig()


def _honest(count: int, size: int = 4096, seed: int = 0) -> list[torch.Tensor]:
    """Parts that agree on a common direction, each with its own noise (a tenth of its norm)."""
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(size, generator=g)
    return [base + 0.1 * torch.randn(size, generator=g) for _ in range(count)]


def _mean64(parts: list[torch.Tensor], weights: list[float]) -> torch.Tensor:
    """The weighted mean in float64, summed in order, cast back: what an honest group must get."""
    total = torch.zeros_like(parts[0], dtype=torch.float64)
    for part, weight in zip(parts, weights):
        total += weight * part.double()
    return (total / sum(weights)).to(parts[0].dtype)


def test_the_reducer_keeps_hiveminds_bookkeeping_and_names_the_bad_sender():
    """Three senders, two parts: sender 2 sends part 0 ×1000, then part 1 while part 0 is not done,
    and its stream is cancelled there. Part 1 is reduced from the other two (hivemind, counting the
    cancelled part as received, would wait for it); nothing of a reduced part is kept."""

    async def scenario():
        parts = [_honest(3, 64, seed) for seed in (0, 1)]  # parts[part][sender]
        reducer = RobustPartReducer([torch.Size([64])] * 2, 3, CONFIG)
        first = [
            asyncio.create_task(reducer.accumulate_part(s, 0, p * (1000 if s == 2 else 1)))
            for s, p in enumerate(parts[0])
        ]
        cancelled = asyncio.create_task(reducer.accumulate_part(2, 1, parts[1][2]))
        await asyncio.sleep(0)  # every call started: part 0 is complete, the part 1 of sender 2 waits
        cancelled.cancel()
        reducer.on_sender_failed(2)  # as the runner does when a sender's stream ends early
        second = [asyncio.create_task(reducer.accumulate_part(s, 1, parts[1][s])) for s in (0, 1)]
        got_first = await asyncio.wait_for(asyncio.gather(*first), 5)
        got_second = await asyncio.wait_for(asyncio.gather(*second), 5)
        assert reducer.finished.is_set() and reducer._inputs == {}
        assert reducer.num_parts_received == [2, 2, 1]  # what the runner checks the all-reduce by
        with pytest.raises(AllreduceException):
            await reducer.accumulate_part(0, 0, torch.zeros(3))  # the wrong shape
        return parts, got_first, got_second, reducer.outliers

    parts, got_first, got_second, outliers = asyncio.run(scenario())
    assert all(g is got_first[0] for g in got_first)  # one result for every sender of a part
    assert torch.equal(got_first[0], _mean64(parts[0][:2], [1.0, 1.0]))
    assert torch.equal(got_second[0], _mean64(parts[1][:2], [1.0, 1.0]))
    assert outliers == {2: {0}}


# ---------------------------------------------------------------- real averagers, one malicious member


def _member_tensors(i: int) -> list[torch.Tensor]:
    common = torch.Generator().manual_seed(11)
    base = [torch.randn(40_000, generator=common), torch.randn(17, generator=common)]
    own = torch.Generator().manual_seed(100 + i)
    return [b + 0.1 * torch.randn(b.shape, generator=own) for b in base]


@pytest.mark.parametrize("attack", ["x1000", "nan"])
def test_a_robust_group_of_four_averages_the_honest_three_and_names_the_fourth(attack):
    def start(i: int) -> list[torch.Tensor]:
        held = _member_tensors(i)
        if i != 3:
            return held
        return [t * 1000 for t in held] if attack == "x1000" else [torch.full_like(t, math.nan) for t in held]

    results, outcomes, named, peer_ids = step_known_group(
        4, start, lambda i: dict(robust=CONFIG), prefix=f"robust-{attack}", part_size_bytes=16 * 1024
    )
    assert outcomes == [None] * 4, outcomes
    honest_mean = [_mean64([_member_tensors(i)[k] for i in range(3)], [1.0] * 3) for k in range(2)]
    for held in results:
        assert all(torch.equal(got, want) for got, want in zip(held, honest_mean))  # hence bit-identical
    # parts of 4096 values: every member reduced some (two or more), so every one saw the fourth's
    assert named[:3] == [[peer_ids[3]]] * 3, named


def test_without_robust_a_nan_is_left_out_of_the_mean_and_its_sender_named():
    """A plain reducer leaves a part holding NaN out (hivemind_adapter.finite_reduce): a pair holds
    the honest member's values, both alike, and each reducer names the NaN's sender."""

    def start(i: int) -> list[torch.Tensor]:
        held = _member_tensors(i)
        return [torch.full_like(t, math.nan) for t in held] if i == 1 else held

    def take_step(i, averager, peer_ids):
        averager.step(timeout=20.0, allow_retries=False)
        return averager.last_outliers(), peer_ids

    results, outcomes, _ = step_pair(VerifiedAverager, start, 20.0, take_step=take_step, prefix="nan-pair")
    assert all(isinstance(o, tuple) for o in outcomes), outcomes
    for got, other, want in zip(results[0], results[1], start(0)):
        assert torch.allclose(got, want, atol=1e-6) and torch.equal(got, other)
    peer_ids = outcomes[0][1]
    assert [named for named, _ in outcomes] == [[peer_ids[1]], [peer_ids[1]]], outcomes


def test_without_robust_a_part_every_sender_spoiled_fails_the_step_and_nobody_writes():
    def start(i: int) -> list[torch.Tensor]:
        return [torch.full_like(t, math.nan) for t in _member_tensors(i)]

    results, outcomes, _ = step_pair(VerifiedAverager, start, 20.0, prefix="nan-both")
    for outcome in outcomes:  # hivemind reports a failed all-reduce as a matchmaking failure
        assert isinstance(outcome, AllReduceBroke) and "NaN" in str(outcome), outcomes
    assert all(torch.isnan(t).all() for held in results for t in held)


# ------------------------------------------------------------------ a reducer that lies


@pytest.mark.parametrize("lie", ["x1000", "negated"])
def test_members_refuse_a_lying_reducers_replies_and_write_nothing(lie):
    """A reducer decides its part's result for every member alike: unchecked, its lie would be applied
    by all of them, with digests that agree. Each honest member checks the replies against its own
    part, refuses the lie, and its step fails with the tensors untouched, naming the reducer (in its
    error and among the peers it reports): nothing wrong is ever written."""

    def start(i: int) -> list[torch.Tensor]:
        return [_honest(4, size=4 * 65536, seed=21)[i]]

    results, outcomes, named, peer_ids = step_known_group(
        4,
        start,
        lambda i: dict(robust=CONFIG),
        lambda i: lying_averager(lie) if i == 3 else VerifiedAverager,
        prefix=f"lying-reducer-{lie}",
        part_size_bytes=256 * 1024,
    )
    for i in range(3):
        assert isinstance(outcomes[i], PartialAllReduceError), outcomes
        assert f"{peer_ids[3][-8:]}: AllreduceException: implausible reply" in str(outcomes[i]), outcomes[i]
        assert torch.equal(results[i][0], start(i)[0]), "a refused step writes nothing"
        assert peer_ids[3] in named[i], named  # what the member reports in its commit


def test_a_reducer_whose_replies_keep_pointing_against_the_members_is_refused_from_then_on(monkeypatch):
    """Parts too short for one reply's direction to prove a lie (below the direction bound) let a
    negating reducer through once where its proofs go unchecked (here: switched off, to test the
    record alone): each member then records every reducer's cosines with its own parts, and from the
    next all-reduce on refuses the one that kept pointing against them, naming it."""
    import hivemind_adapter.exact_runner

    monkeypatch.setattr(hivemind_adapter.exact_runner, "check_proof", lambda *args, **kwargs: None)

    def start(i: int) -> list[torch.Tensor]:
        return [_honest(4, size=4 * 16384, seed=22)[i]]

    steps, peer_ids = step_known_group_repeatedly(
        4,
        2,
        start,
        lambda i: dict(robust=CONFIG),
        lambda i: lying_averager("negated") if i == 3 else VerifiedAverager,
        prefix="quiet-liar",
        part_size_bytes=16 * 1024,  # 4096 values a part: only the length of one reply is judged
    )
    (first, first_outcomes, _), (second, second_outcomes, named) = steps
    assert all(o is None for o in first_outcomes[:3]), first_outcomes  # the lie went through once
    assert not torch.equal(first[0][0], _mean64([start(i)[0] for i in range(4)], [1.0] * 4))
    for i in range(3):
        assert isinstance(second_outcomes[i], PartialAllReduceError), second_outcomes
        assert "kept pointing against" in str(second_outcomes[i]), second_outcomes[i]
        assert torch.equal(second[i][0], start(i)[0]), "a refused step writes nothing"
        assert peer_ids[3] in named[i], named
