"""The background input pipeline gives exactly the batches the loop made itself, stops its threads
when the loop ends, and hands a failed batch's exception to the loop; a contribution computed with it
is the same, bit for bit, however far ahead it runs (what a spot audit's replay relies on)."""

from __future__ import annotations

import dataclasses
import threading
import time

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset

from supernet.batch_prefetch import BatchPrefetcher, batch_maker, contribution_generators
from supernet.contribution import compute_contribution
from supernet.training.schedule import step_configs
from supernet.workload import Workload, workload_for
from tasks.sharding import SampleStream, augmentation_seed
from tests.supernet.threads import single_torch_thread  # noqa: F401

TINY = dict(width_mult=0.25, head_channels=32, channel_divisor=4, batch_size=16, num_subnets=2)


def _pipeline_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(("batch-producer", "batch-decode"))]


class _Recording(Dataset):
    """A dataset's samples, slowly, recording which were read; ``missing`` ones raise LookupError
    (what a sample of a shard file that is not on disk does)."""

    def __init__(self, inner: Dataset, missing: frozenset[int] = frozenset(), delay: float = 0.0):
        self.inner, self.missing, self.delay = inner, missing, delay
        self.read: list[int] = []

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, index: int):
        if self.delay:
            time.sleep(self.delay)
        self.read.append(index)
        if index in self.missing:
            raise LookupError(f"sample {index}: its shard is not on this peer")
        return self.inner[index]


def _with_train_set(workload: Workload, train_set: Dataset) -> Workload:
    return Workload(workload.family, workload.cfg, dataclasses.replace(workload.task, train_set=train_set))


def _stream_batches(workload: Workload, count: int, **prefetch) -> list[tuple[np.ndarray, object]]:
    seed = augmentation_seed(7, 3, "peer/0")
    generator, _ = contribution_generators(seed)
    stream = SampleStream(len(workload.task.train_set), 7, 3, "peer/0")
    out = []
    with BatchPrefetcher(
        workload.task.train_set,
        lambda: stream.take(workload.cfg.batch_size),
        batch_maker(workload, generator),
        **prefetch,
    ) as batches:
        for indices, batch in batches:
            out.append((indices, batch))
            if len(out) == count:
                break
    return out


def _synchronous_batches(workload: Workload, count: int) -> list[tuple[np.ndarray, object]]:
    """What the worker's loop did before: ``Workload.batch`` in the loop, one batch at a time."""
    generator, _ = contribution_generators(augmentation_seed(7, 3, "peer/0"))
    stream = SampleStream(len(workload.task.train_set), 7, 3, "peer/0")
    out = []
    for _ in range(count):
        indices = stream.take(workload.cfg.batch_size)
        out.append((indices, workload.batch(indices, generator)))
    return out


def _same_batch(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize(
    "prefetch",
    [
        dict(depth=0),
        dict(depth=1, decode_threads=0),
        dict(depth=3, decode_threads=3),
        dict(depth=2, processes=2),
    ],
)
def test_the_pipeline_gives_the_synchronous_batches_in_order(prefetch):
    workload = workload_for("digits", TINY)
    assert workload.task.augmentation is not None  # the batches are augmented: the draws are checked
    expected = _synchronous_batches(workload, 6)
    got = _stream_batches(workload, 6, **prefetch)
    for (want_idx, want), (idx, batch) in zip(expected, got, strict=True):
        assert np.array_equal(want_idx, idx)
        assert _same_batch(want, batch)
    assert not _pipeline_threads()


def test_the_pipeline_serves_stereo_batches_as_the_workload_makes_them():
    workload = workload_for("stereo-synthetic", {"batch_size": 2})
    expected = _synchronous_batches(workload, 2)
    got = _stream_batches(workload, 2, depth=2, decode_threads=2)
    for (want_idx, want), (idx, batch) in zip(expected, got, strict=True):
        assert np.array_equal(want_idx, idx)
        assert _same_batch(want, batch)


def test_threads_are_joined_when_the_loop_stops_early_and_batches_ahead_are_discarded():
    workload = workload_for("digits", TINY)
    slow = _Recording(workload.task.train_set, delay=0.001)
    made = []

    def make(samples):
        made.append(len(samples))
        return batch_maker(workload, torch.Generator().manual_seed(0))(samples)

    stream = SampleStream(len(slow), 7, 3, "peer/0")
    pipeline = BatchPrefetcher(slow, lambda: stream.take(16), make, depth=2, decode_threads=2)
    next(pipeline)
    deadline = time.monotonic() + 10
    while len(made) < 4 and time.monotonic() < deadline:  # the producer runs ahead of the consumer
        time.sleep(0.01)
    time.sleep(0.2)
    assert len(made) == 4  # one consumed, two in the queue, one waiting for room: bounded
    assert _pipeline_threads()
    started = time.monotonic()
    pipeline.close()
    assert time.monotonic() - started < 5
    assert not _pipeline_threads() and not pipeline.threads
    with pytest.raises(StopIteration):
        next(pipeline)


@pytest.mark.parametrize("decoding", [dict(decode_threads=2), dict(processes=2)])
def test_an_exception_in_a_datasets_getitem_reaches_the_loop_after_the_batches_before_it(decoding):
    workload = workload_for("digits", TINY)
    stream_order = SampleStream(len(workload.task.train_set), 7, 3, "peer/0").take(16 * 4)
    missing = int(stream_order[16 * 2 + 5])  # a sample of the third batch
    broken = _Recording(workload.task.train_set, missing=frozenset({missing}))
    stream = SampleStream(len(broken), 7, 3, "peer/0")
    received = 0
    with pytest.raises(LookupError, match=f"sample {missing}: its shard is not on this peer"):
        with BatchPrefetcher(
            broken,
            lambda: stream.take(16),
            batch_maker(workload, torch.Generator().manual_seed(0)),
            depth=2,
            **decoding,
        ) as batches:
            for _ in batches:
                received += 1
    assert received == 2
    assert not _pipeline_threads()


def test_a_contribution_is_the_same_however_far_ahead_the_pipeline_runs():
    """Dropout on, so the augmentation and the dropout masks are both replayed; an audit-like replay
    (another call, another pipeline depth) gets the very same numbers."""
    workload = workload_for("digits", dict(TINY, dropout=0.3))
    net = workload.build()
    configs = step_configs(net, 3, workload.cfg)

    def contribution(**options):
        work = compute_contribution(
            workload, net, configs, "cpu", 7, 3, "peer/0", go_on=lambda n: n < 64, **options
        )
        assert work.samples == 64
        return work

    reference = contribution(prefetch=0)
    for options in (
        dict(),
        dict(prefetch=1, decode_threads=0),
        dict(prefetch=3, decode_threads=3),
        dict(prefetch=2, decode_processes=2),
    ):
        replay = contribution(**options)
        assert replay.loss_sum == reference.loss_sum and replay.macs == reference.macs
        assert all(torch.equal(a, b) for a, b in zip(reference.numerator, replay.numerator, strict=True))
    assert not _pipeline_threads()
    other = compute_contribution(workload, net, configs, "cpu", 7, 3, "peer/1", go_on=lambda n: n < 64)
    assert not all(torch.equal(a, b) for a, b in zip(reference.numerator, other.numerator, strict=True))


def test_a_contribution_reads_only_samples_of_its_pool():
    workload = workload_for("digits", TINY)
    recording = _Recording(workload.task.train_set)
    workload = _with_train_set(workload, recording)
    net = workload.build()
    configs = step_configs(net, 0, workload.cfg)
    pool = np.arange(100, 160, dtype=np.int64)
    work = compute_contribution(
        workload, net, configs, "cpu", 7, 0, "peer/0", go_on=lambda n: n < 32, pool=pool
    )
    assert work.samples == 32
    assert recording.read and set(recording.read) <= set(pool.tolist())
