"""Where hivemind's all-reduce puts each part: hivemind never splits a part across tensors and deals
consecutive parts of the flat vector to the reducers in group order. Pure functions of a
:class:`~hivemind.averaging.partition.TensorPartContainer`'s layout."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from hivemind.averaging.partition import TensorPartContainer


@dataclass(frozen=True)
class PartLayout:
    """Where the parts lie in the flat vector: ``starts[k]`` is where the k-th part (in vector order)
    begins, ``starts[-1]`` the vector's end; ``parts_by_peer[i]``: how many parts reducer i reduces."""

    starts: tuple[int, ...]
    parts_by_peer: tuple[int, ...]

    def part_range(self, peer_index: int, index: int) -> tuple[int, int]:
        """``[start, end)`` of the ``index``-th part that reducer ``peer_index`` reduces."""
        first = sum(self.parts_by_peer[:peer_index]) + index
        return self.starts[first], self.starts[first + 1]


def part_layout(container: TensorPartContainer) -> PartLayout:
    """The layout of ``container``'s input parts."""
    parts = container._input_parts_by_peer
    starts = (0, *itertools.accumulate(part.numel() for held in parts for part, _ in held))
    return PartLayout(starts, tuple(container.num_parts_by_peer))


def slotted_parts(container: TensorPartContainer, peer_index: int, slotted_tensors: int) -> frozenset[int]:
    """Indices, among the parts reducer ``peer_index`` reduces, of the last ``slotted_tensors``
    tensors' parts (the last parts of the vector). Raises ``ValueError`` if one of those tensors
    spans more than one part."""
    if slotted_tensors <= 0:
        return frozenset()
    by_tensor = container.num_parts_by_tensor[-slotted_tensors:]
    if any(n != 1 for n in by_tensor):
        raise ValueError("a slotted tensor must fit in one part")
    total = sum(container.num_parts_by_tensor)
    first = sum(container.num_parts_by_peer[:peer_index])
    theirs = range(first, first + container.num_parts_by_peer[peer_index])
    return frozenset(i - first for i in range(total - len(by_tensor), total) if i in theirs)
