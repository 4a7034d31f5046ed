"""The averaged tensors laid end to end: what the hivemind averagers hold.

hivemind cuts every tensor of an averager into parts of its own, so a supernet's 228 parameters
(most of them a few dozen batch-norm values) made 229 parts per all-reduce: 229 messages, and with
robust averaging as many centres, proofs and proof checks, whatever the vector's size. Laid end to
end they make one part per ``part_size_bytes``, as BTARD cuts its vector. Tensors of one dtype share
one flat tensor, in the template's order."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class FlatLayout:
    """Where each of a template's tensors lies: ``shapes[i]`` and ``dtypes[i]`` are tensor ``i``'s, and
    it occupies ``flat[slots[i]]``'s values ``offsets[i]`` to ``offsets[i] + numel``."""

    shapes: tuple[torch.Size, ...]
    dtypes: tuple[torch.dtype, ...]
    slots: tuple[int, ...]
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]  # values per flat tensor

    @classmethod
    def of(cls, template: Sequence[torch.Tensor]) -> FlatLayout:
        if not template:
            raise ValueError("an averager needs at least one tensor")
        order: list[torch.dtype] = []
        filled: dict[torch.dtype, int] = {}
        slots, offsets = [], []
        for t in template:
            if t.dtype not in filled:
                order.append(t.dtype)
                filled[t.dtype] = 0
            slots.append(order.index(t.dtype))
            offsets.append(filled[t.dtype])
            filled[t.dtype] += t.numel()
        return cls(
            tuple(t.shape for t in template), tuple(t.dtype for t in template), tuple(slots),
            tuple(offsets), tuple(filled[d] for d in order),
        )  # fmt: skip

    @property
    def flat_dtypes(self) -> tuple[torch.dtype, ...]:
        return tuple(dict.fromkeys(self.dtypes))

    def zeros(self) -> list[torch.Tensor]:
        """Fresh flat tensors of zeros, one per dtype."""
        return [torch.zeros(n, dtype=d) for n, d in zip(self.sizes, self.flat_dtypes)]

    def pack_into(self, flats: Sequence[torch.Tensor], tensors: Sequence[torch.Tensor]) -> None:
        """Copy ``tensors`` (the template's shapes) into their places in ``flats``."""
        if len(tensors) != len(self.shapes):
            raise ValueError(f"{len(tensors)} tensors for a layout of {len(self.shapes)}")
        for t, slot, offset in zip(tensors, self.slots, self.offsets):
            flats[slot][offset : offset + t.numel()].copy_(t.reshape(-1))

    def split(self, flats: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The template's tensors as views of ``flats`` (share their memory)."""
        return [
            flats[slot][offset : offset + math.prod(shape)].view(shape)
            for shape, slot, offset in zip(self.shapes, self.slots, self.offsets)
        ]
