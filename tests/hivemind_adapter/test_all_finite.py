"""An all-reduce's result is refused if any value is a NaN or an infinity, wherever it sits."""

from __future__ import annotations

import pytest
import torch

from hivemind_adapter.allreduce import all_finite


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
