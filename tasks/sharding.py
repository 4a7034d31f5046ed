"""Deterministic data sharding for a swarm: which samples a participant trains on in a round.

Design (no communication; every participant computes the same plan from public values):

1. **A stream of epochs.** Epoch ``e`` is a permutation of ``range(dataset_size)`` drawn from a
   private generator seeded with a SHA-256 of ``(task_seed, e)``.
2. **Rounds consume epochs in equal slices.** Each round uses at most ``round_size`` samples in total
   (default: the whole dataset). An epoch is cut into ``rounds_per_epoch = ceil(dataset_size /
   round_size)`` consecutive slices whose sizes differ by at most one (``numpy.array_split``, so there is
   no tiny last batch); round ``r`` takes slice ``r % rounds_per_epoch`` of epoch
   ``r // rounds_per_epoch``. A round never spans two epochs.
3. **A round's slice is split among its participants.** The participant ids (e.g.
   ``f"{peer_id}/{worker}"``) are de-duplicated and sorted, so the order they are given in does not
   matter, and the slice is cut into consecutive pieces, equal (± 1) or proportional to ``weights``.

Hence, within a round, the indices of different participants never overlap (they are disjoint pieces
of one slice of one permutation), and every ``rounds_per_epoch`` consecutive rounds (aligned to epochs)
cover every sample exactly once, whoever participated. The per-round total is fixed by the task, not by
the number of participants (like a target global batch size).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence

import numpy as np

__all__ = [
    "SampleStream",
    "augmentation_seed",
    "epoch_permutation",
    "round_slice",
    "rounds_per_epoch",
    "shard_indices",
    "split_counts",
    "stream_indices",
]


def _seed(*parts) -> int:
    payload = json.dumps(["manta.shard", *parts], separators=(",", ":")).encode("utf-8")
    return int.from_bytes(hashlib.sha256(payload).digest()[:8], "big")


def _check_positive(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name}: need a positive integer, got {value!r}")
    return int(value)


def epoch_permutation(dataset_size: int, task_seed: int | str, epoch: int) -> np.ndarray:
    """The order of all samples in ``epoch`` (int64), the same on every machine."""
    dataset_size = _check_positive("dataset_size", dataset_size)
    generator = np.random.Generator(np.random.PCG64(_seed(task_seed, int(epoch))))
    return generator.permutation(dataset_size).astype(np.int64)


def rounds_per_epoch(dataset_size: int, round_size: int | None = None) -> int:
    dataset_size = _check_positive("dataset_size", dataset_size)
    round_size = dataset_size if round_size is None else _check_positive("round_size", round_size)
    return math.ceil(dataset_size / min(round_size, dataset_size))


def round_slice(
    dataset_size: int, task_seed: int | str, round: int, round_size: int | None = None
) -> np.ndarray:
    """All sample indices of ``round`` (before splitting among participants)."""
    if isinstance(round, bool) or not isinstance(round, (int, np.integer)) or round < 0:
        raise ValueError(f"round: need a non-negative integer, got {round!r}")
    per_epoch = rounds_per_epoch(dataset_size, round_size)
    epoch, position = divmod(int(round), per_epoch)
    return np.array_split(epoch_permutation(dataset_size, task_seed, epoch), per_epoch)[position]


def split_counts(
    total: int, participants: Sequence[str], weights: Mapping[str, float] | None = None
) -> list[int]:
    """How many of ``total`` samples each (sorted) participant gets: equal ± 1, or by weight.

    Weighted shares use largest remainders (ties to the earlier participant), so they add up to
    ``total`` exactly and are deterministic.
    """
    n = len(participants)
    if weights is None:
        base, extra = divmod(total, n)
        return [base + (1 if i < extra else 0) for i in range(n)]
    values = []
    for p in participants:
        w = weights.get(p)
        if w is None or not math.isfinite(w) or w < 0:
            raise ValueError(f"weights[{p!r}]: need a finite non-negative weight, got {w!r}")
        values.append(float(w))
    whole = sum(values)
    if whole <= 0:
        raise ValueError("weights: at least one participant needs a positive weight")
    exact = [total * w / whole for w in values]
    counts = [math.floor(x) for x in exact]
    order = sorted(range(n), key=lambda i: (-(exact[i] - counts[i]), i))
    for i in order[: total - sum(counts)]:
        counts[i] += 1
    return counts


def shard_indices(
    dataset_size: int,
    task_seed: int | str,
    round: int,
    participants: Sequence[str],
    participant: str,
    round_size: int | None = None,
    weights: Mapping[str, float] | None = None,
) -> np.ndarray:
    """The sample indices ``participant`` trains on in ``round`` (int64 array, in stream order).

    ``participants`` — everyone taking part in this round (ids such as ``f"{peer_id}/{worker}"``;
    order and duplicates do not matter); ``round_size`` — samples per round in total (default: the
    dataset size, i.e. one epoch per round); ``weights`` — optional relative shares per participant
    (e.g. measured throughput). See the module docstring for the guarantees.
    """
    members = sorted(set(participants))
    if not members:
        raise ValueError("participants: need at least one participant")
    if participant not in members:
        raise ValueError(f"participant: {participant!r} is not among the round's participants")
    chunk = round_slice(dataset_size, task_seed, round, round_size)
    counts = split_counts(len(chunk), members, weights)
    index = members.index(participant)
    start = sum(counts[:index])
    return chunk[start : start + counts[index]]


# --------------------------------------------------------------------------------------------------
# Open-ended per-participant streams (swarm rounds that close on a global sample count)
# --------------------------------------------------------------------------------------------------


def _check_pool(pool: np.ndarray, dataset_size: int) -> np.ndarray:
    pool = np.asarray(pool, dtype=np.int64)
    if pool.ndim != 1 or len(pool) == 0:
        raise ValueError("pool: need a non-empty one-dimensional array of sample indices")
    if pool.min() < 0 or pool.max() >= dataset_size:
        raise ValueError(f"pool: sample indices must lie in [0, {dataset_size})")
    return pool


class SampleStream:
    """The samples one participant trains on in one round when nobody knows in advance how many it
    will manage: an endless, deterministic stream, of which it takes as many as it processes.

    With ``pool`` (the samples of the data shards the participant holds, see
    :mod:`tasks.shard_assignment`) the permutations are of the pool instead of the whole dataset, so a
    peer only ever reads samples it downloaded; anyone who knows the pool replays the same stream.

    The stream of ``(task_seed, round, participant)`` is a sequence of permutations of the dataset
    (one after another, each seeded by a SHA-256 of those values and its position), so within a
    participant's round no sample repeats before the whole dataset was seen; across participants the
    streams are independent (sampling with replacement between peers, as in data-parallel training
    with random sampling). Anyone can recompute what a participant's first ``n`` samples were from
    public values alone (what an audit re-does).
    """

    def __init__(
        self,
        dataset_size: int,
        task_seed: int | str,
        round: int,
        participant: str,
        pool: np.ndarray | None = None,
    ):
        self.dataset_size = _check_positive("dataset_size", dataset_size)
        self._key = (task_seed, int(round), str(participant))
        self._block, self._perm = -1, np.empty(0, dtype=np.int64)
        self._pool = None if pool is None else _check_pool(pool, self.dataset_size)
        self._period = self.dataset_size if self._pool is None else len(self._pool)
        self.position = 0

    def _permutation(self, block: int) -> np.ndarray:
        if block != self._block:
            generator = np.random.Generator(np.random.PCG64(_seed("stream", *self._key, block)))
            order = generator.permutation(self._period).astype(np.int64)
            self._block, self._perm = block, order if self._pool is None else self._pool[order]
        return self._perm

    def take(self, count: int) -> np.ndarray:
        """The next ``count`` indices of the stream (int64)."""
        out = []
        while count > 0:
            block, offset = divmod(self.position, self._period)
            piece = self._permutation(block)[offset : offset + count]
            out.append(piece)
            self.position += len(piece)
            count -= len(piece)
        return np.concatenate(out) if out else np.empty(0, dtype=np.int64)


def augmentation_seed(task_seed: int | str, round: int, participant: str) -> int:
    """The seed of the ``torch.Generator`` a participant's round draws from (augmentation and dropout),
    so anyone replaying its mini-batches in order (an audit) draws exactly the same random numbers."""
    return _seed("augmentation", task_seed, int(round), str(participant)) % (2**63)


def stream_indices(
    dataset_size: int,
    task_seed: int | str,
    round: int,
    participant: str,
    count: int,
    pool: np.ndarray | None = None,
) -> np.ndarray:
    """The first ``count`` indices of ``participant``'s stream in ``round`` (see :class:`SampleStream`)."""
    return SampleStream(dataset_size, task_seed, round, participant, pool).take(count)
