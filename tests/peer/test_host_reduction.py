"""The host stage's bucketed all-reduce, between two real gloo processes: the same sums as one
collective per tensor, bit for bit, in ceil(bytes / bucket) collectives."""

from __future__ import annotations

import math
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from peer.host_reduction import allreduce_bucketed, bucket_count

BUCKET = 4096  # bytes: small enough that tensors straddle buckets
SHAPES = [(16,), (3, 5, 7), (1000,), (4, 300), (), (1,), (0,), (33, 33)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tensors(rank: int) -> list[torch.Tensor]:
    """Each rank's different values: float32 tensors (one of them strided), and two float64 ones."""
    generator = torch.Generator().manual_seed(1000 + rank)
    out = [torch.randn(shape, generator=generator) for shape in SHAPES]
    out.append(torch.randn(20, 30, generator=generator).t())  # not contiguous
    out += [torch.randn(200, generator=generator, dtype=torch.float64) for _ in range(2)]
    return out


def _rank_main(rank: int, port: int, results) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        per_tensor = _tensors(rank)
        for t in per_tensor:
            dist.all_reduce(t)
        bucketed = _tensors(rank)
        issued = allreduce_bucketed(bucketed, bucket_bytes=BUCKET)
        one_bucket = _tensors(rank)
        issued_default = allreduce_bucketed(one_bucket)
        # as numpy arrays: pickled by value, not torch's shared memory, which dies with this process
        arrays = [[t.numpy().copy() for t in ts] for ts in (per_tensor, bucketed, one_bucket)]
        results.put((rank, issued, issued_default, *arrays))
    finally:
        dist.destroy_process_group()


def test_bucketed_sums_equal_per_tensor_sums_in_fewer_collectives():
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank_main, args=(rank, port, results), daemon=True) for rank in range(2)]
    for p in procs:
        p.start()
    try:
        answers = [results.get(timeout=60) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    assert all(p.exitcode == 0 for p in procs)
    expected = [a + b for a, b in zip(_tensors(0), _tensors(1), strict=True)]
    float32_bytes = sum(t.numel() * 4 for t in expected if t.dtype == torch.float32)
    float64_bytes = sum(t.numel() * 8 for t in expected if t.dtype == torch.float64)
    collectives = math.ceil(float32_bytes / BUCKET) + math.ceil(float64_bytes / BUCKET)
    assert bucket_count(expected, BUCKET) == collectives
    for _rank, issued, issued_default, *arrays in answers:
        assert issued == collectives < len(expected)
        assert issued_default == 2  # one per dtype under the default 25 MiB
        per_tensor, bucketed, one_bucket = ([torch.from_numpy(a) for a in ts] for ts in arrays)
        for want, a, b, c in zip(expected, per_tensor, bucketed, one_bucket, strict=True):
            assert a.shape == b.shape == c.shape == want.shape
            assert torch.equal(a, want) and torch.equal(b, a) and torch.equal(c, a)
