"""The averagers' flat buffer (peer.averaging.flat_vector) and its part size: pure torch."""

from __future__ import annotations

import pytest
import torch
from hivemind.averaging.partition import TensorPartContainer

from peer.averaging.factory import MIN_PART_BYTES, MIN_PARTS, ROBUST_PART_SIZE_BYTES, part_size_bytes
from peer.averaging.flat_vector import FlatLayout


def test_tensors_go_end_to_end_by_dtype_and_come_back_as_they_were():
    g = torch.Generator().manual_seed(0)
    tensors = [
        torch.randn(5, 7, generator=g),
        torch.arange(6, dtype=torch.float64).reshape(2, 3),
        torch.randn(13, generator=g),
        torch.randn(2, 2, 2, generator=g).permute(2, 0, 1),  # not contiguous, as a channels-last one
    ]
    layout = FlatLayout.of(tensors)
    flats = layout.zeros()
    assert [(f.numel(), f.dtype) for f in flats] == [(35 + 13 + 8, torch.float32), (6, torch.float64)]
    layout.pack_into(flats, tensors)
    back = layout.split(flats)
    assert all(torch.equal(b, t) and b.dtype == t.dtype for b, t in zip(back, tensors))
    back[2].zero_()  # views: the flat tensor itself changed
    assert float(flats[0][35:48].abs().sum()) == 0.0
    with pytest.raises(ValueError, match="3 tensors for a layout of 4"):
        layout.pack_into(flats, tensors[:3])


def test_a_supernets_many_small_tensors_make_parts_by_size_not_one_per_tensor():
    shapes = [(16,)] * 150 + [(11760,)] * 78  # the digits supernet at width 0.25: 228 tensors, 1.3 MB
    tensors = [torch.zeros(s) for s in shapes]
    per_tensor = TensorPartContainer(tensors, [1.0, 1.0], part_size_bytes=ROBUST_PART_SIZE_BYTES)
    flats = FlatLayout.of(tensors).zeros()
    size = part_size_bytes(sum(f.numel() * f.element_size() for f in flats), robust=True)
    end_to_end = TensorPartContainer(flats, [1.0] * 8, part_size_bytes=size)
    assert sum(per_tensor.num_parts_by_tensor) == 228
    assert sum(end_to_end.num_parts_by_tensor) == MIN_PARTS
    assert all(n > 0 for n in end_to_end.num_parts_by_peer)  # a group of 8: each reduces its share


def test_the_part_size_keeps_to_its_bounds():
    assert part_size_bytes(100, robust=True) == MIN_PART_BYTES
    assert part_size_bytes(400 * 2**20, robust=True) == ROBUST_PART_SIZE_BYTES
    assert part_size_bytes(400 * 2**20, robust=False) == 4 * 2**20
    assert part_size_bytes(MIN_PARTS * 2**18, robust=False) == 2**18
