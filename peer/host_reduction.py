"""The host stage's sum of several workers' gradients in a few large collectives, not one per tensor.

A worker's gradient numerator is one tensor per parameter: a few hundred, most of them small (a
batch-norm's 16 scales). One ``all_reduce`` per tensor pays each collective's fixed cost (a round
trip through gloo's TCP pairs, an NCCL kernel launch and its synchronisation) hundreds of times.
:func:`allreduce_bucketed` lays the tensors end to end, one dtype and device at a time, and reduces
them in buckets of at most ``bucket_bytes`` (a tensor may straddle two buckets), so a group of
tensors of ``B`` bytes costs ``ceil(B / bucket_bytes)`` collectives; the sums are copied back in
place. Every rank must pass tensors of the same shapes, dtypes and order (the same model), as with a
per-tensor loop. With two workers each element's sum is bitwise what the per-tensor collective gives
(one addition, which commutes); with more, the collective may add an element's terms in another order,
so the last bit may differ, as it may between any two ways of cutting the same reduction.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

__all__ = ["DEFAULT_BUCKET_BYTES", "allreduce_bucketed", "bucket_count"]

DEFAULT_BUCKET_BYTES = 25 << 20  # as torch's DistributedDataParallel


def _groups(tensors: Sequence[torch.Tensor]) -> list[list[torch.Tensor]]:
    """The non-empty tensors by (device, dtype), each group in the order given."""
    groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    for t in tensors:
        if t.numel() > 0:
            groups.setdefault((t.device, t.dtype), []).append(t)
    return list(groups.values())


def _bucket_elements(dtype: torch.dtype, bucket_bytes: int) -> int:
    return max(1, bucket_bytes // torch.empty((), dtype=dtype).element_size())


def bucket_count(tensors: Sequence[torch.Tensor], bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> int:
    """How many collectives :func:`allreduce_bucketed` issues for ``tensors``."""
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes: {bucket_bytes} is not positive")
    count = 0
    for group in _groups(tensors):
        per_bucket = _bucket_elements(group[0].dtype, bucket_bytes)
        total = sum(t.numel() for t in group)
        count += -(-total // per_bucket)
    return count


def allreduce_bucketed(
    tensors: Sequence[torch.Tensor], bucket_bytes: int = DEFAULT_BUCKET_BYTES, group=None
) -> int:
    """Sum ``tensors`` in place over the process group ``group`` (default: the whole world) in
    buckets of at most ``bucket_bytes``; returns the number of collectives issued."""
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes: {bucket_bytes} is not positive")
    issued = 0
    for same_kind in _groups(tensors):
        dtype, device = same_kind[0].dtype, same_kind[0].device
        per_bucket = _bucket_elements(dtype, bucket_bytes)
        total = sum(t.numel() for t in same_kind)
        # flat views to read from and write back to (a contiguous copy for the rare strided tensor)
        flats = [t.view(-1) if t.is_contiguous() else t.contiguous().view(-1) for t in same_kind]
        buffer = torch.empty(min(per_bucket, total), dtype=dtype, device=device)
        tensor_index, offset = 0, 0  # where in the tensors the next bucket starts
        for start in range(0, total, per_bucket):
            size = min(per_bucket, total - start)
            pieces, filled, i, o = [], 0, tensor_index, offset
            while filled < size:  # which stretches of which tensors fill this bucket
                take = min(flats[i].numel() - o, size - filled)
                pieces.append((i, o, take, filled))
                buffer[filled : filled + take].copy_(flats[i][o : o + take])
                filled += take
                o += take
                if o == flats[i].numel():
                    i, o = i + 1, 0
            bucket = buffer[:size]
            dist.all_reduce(bucket, group=group)
            issued += 1
            for i_, o_, take, at in pieces:
                flats[i_][o_ : o_ + take].copy_(bucket[at : at + take])
            tensor_index, offset = i, o
        for t, flat in zip(same_kind, flats):
            if not t.is_contiguous():
                t.copy_(flat.view(t.shape))
    return issued
