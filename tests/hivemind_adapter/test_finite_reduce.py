"""The plain reducer: a NaN or an infinity is found wherever it sits; a sender's part that holds one
is left out of the mean and its sender named; slotted parts keep each slot's owner's value."""

from __future__ import annotations

import asyncio
import math

import pytest
import torch

from hivemind_adapter.finite_reduce import FiniteMeanReducer, all_finite


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_a_nan_or_an_infinity_anywhere_in_any_tensor_is_found(dtype):
    generator = torch.Generator().manual_seed(0)
    for size in (1, 7, 16, 33, 4097):
        for place in {0, size // 2, size - 1}:
            for bad in (float("nan"), float("inf"), float("-inf")):
                clean = torch.randn(size, generator=generator).to(dtype)
                spoiled = clean.clone()
                spoiled[place] = bad
                assert all_finite([clean, torch.zeros(0, dtype=dtype)])
                assert not all_finite([clean, spoiled.reshape(1, -1)]), (size, place, bad)


def test_integer_and_empty_tensors_are_finite():
    assert all_finite([torch.arange(5), torch.zeros(0), torch.tensor(3.0)])


def _reduce(
    parts: list[list[torch.Tensor]], weights: list[float], slotted=()
) -> tuple[FiniteMeanReducer, list]:
    """Every sender's parts through one reducer, concurrently, as a reducer receives them."""

    async def run():
        reducer = FiniteMeanReducer([p.shape for p in parts[0]], len(parts), slotted)

        async def send(i):
            return [
                await reducer.accumulate_part(i, j, part, weight=weights[i])
                for j, part in enumerate(parts[i])
            ]

        return reducer, await asyncio.gather(*(send(i) for i in range(len(parts))))

    return asyncio.run(run())


def test_a_part_holding_a_nan_is_left_out_of_the_weighted_mean_and_its_sender_named():
    generator = torch.Generator().manual_seed(1)
    parts = [[torch.randn(64, generator=generator) for _ in range(3)] for _ in range(4)]
    parts[2][1][17] = math.nan  # sender 2 spoils its second part only
    parts[3][0][0] = math.inf  # sender 3 its first
    weights = [16.0, 32.0, 48.0, 8.0]
    reducer, results = _reduce(parts, weights)
    for j in range(3):
        kept = [i for i in range(4) if (i, j) not in {(2, 1), (3, 0)}]
        want = sum(weights[i] * parts[i][j].double() for i in kept) / sum(weights[i] for i in kept)
        assert all(torch.allclose(r[j].double(), want, atol=1e-6) for r in results), j
        assert len({r[j].numpy().tobytes() for r in results}) == 1  # every sender receives the same bytes
    assert reducer.outliers == {2: {1}, 3: {0}}


def test_a_receiver_of_weight_zero_adds_nothing_and_is_not_named():
    parts = [[torch.full((8,), 3.0)], [torch.full((8,), math.nan)]]
    reducer, results = _reduce(parts, [1.0, 0.0])
    assert all(torch.equal(r[0], torch.full((8,), 3.0)) for r in results)
    assert reducer.outliers == {}


def test_a_part_every_sender_spoiled_has_no_mean():
    parts = [[torch.full((8,), math.nan)], [torch.full((8,), -math.inf)]]
    reducer, results = _reduce(parts, [1.0, 1.0])
    assert not all_finite([results[0][0]])
    assert reducer.outliers == {0: {0}, 1: {0}}


def test_a_slotted_part_keeps_each_owners_value_whatever_the_weights():
    senders = 3
    rolls = []
    for i in range(senders):
        roll = torch.zeros(12, dtype=torch.float64)
        roll[i] = 10.0 * (i + 1)  # sender i's count in its own slot
        rolls.append([torch.randn(4), roll])
    rolls[2][1][0] = 99.0  # sender 2 writes in sender 0's slot too
    reducer, results = _reduce(rolls, [5.0, 1.0, 2.0], slotted={1})
    counts = [round(float(v) * senders) for v in results[0][1][:senders]]
    assert counts == [10, 20, 0]  # the forger's own count is dropped with its forgery
    assert reducer.outliers == {2: {1}}
