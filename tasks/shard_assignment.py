"""Which data shards each peer trains on: decided by everyone alike from public values, no messages.

An epoch of a task whose data is packed into shards (:mod:`protocol.shards`) is
``ceil(train_samples / target_samples_per_round)`` rounds. In epoch ``e`` every training shard belongs
to exactly one peer of the roster: the one with the highest SHA-256 score of ``(task seed, e, shard,
peer)`` (rendezvous hashing). So

* the roster's peers together cover every shard of every epoch, and no shard twice;
* every peer computes the same assignment from the same roster, and a peer joining or leaving moves
  only the shards it wins or held (about ``1 / peers`` of them), not everyone's;
* a new epoch deals the shards anew, so over epochs each peer sees different data;
* a peer's next epoch is known in advance: it downloads those shards while it trains on these.

Within a round a worker draws its mini-batches from the samples of its peer's shards
(:class:`tasks.sharding.SampleStream` with ``pool``). The peer signs the shard indices into its
receipt, so the aggregator's audit replays the same stream.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence

import numpy as np

from protocol.shards import ShardEntry

__all__ = ["assigned_shards", "epoch_of_round", "rounds_per_epoch", "sample_pool", "within_budget"]


def rounds_per_epoch(train_samples: int, samples_per_round: int) -> int:
    if train_samples < 1 or samples_per_round < 1:
        raise ValueError("train_samples and samples_per_round must be positive")
    return math.ceil(train_samples / samples_per_round)


def epoch_of_round(round_index: int, train_samples: int, samples_per_round: int) -> int:
    return int(round_index) // rounds_per_epoch(train_samples, samples_per_round)


def _score(task_seed: int, epoch: int, shard: int, peer: str) -> bytes:
    return hashlib.sha256(f"manta.shard-owner|{task_seed}|{epoch}|{shard}|{peer}".encode()).digest()


def assigned_shards(
    shards: Sequence[int], task_seed: int, epoch: int, roster: Sequence[str], peer: str
) -> tuple[int, ...]:
    """The shard indices (of ``shards``, the training shards) ``peer`` owns in ``epoch`` under
    ``roster``, in the order it should fetch them (its highest-scored first). A peer missing from
    ``roster`` (it has not announced yet) computes its share as if it were in it."""
    members = sorted(set(roster) | {peer})
    mine = []
    for shard in shards:
        owner = max(members, key=lambda member: _score(task_seed, epoch, shard, member))
        if owner == peer:
            mine.append(shard)
    if not mine and shards:  # more peers than shards: share the one it scores highest on
        mine.append(max(shards, key=lambda shard: _score(task_seed, epoch, shard, peer)))
    return tuple(sorted(mine, key=lambda shard: _score(task_seed, epoch, shard, peer), reverse=True))


def within_budget(entries: Sequence[ShardEntry], budget_bytes: int) -> tuple[ShardEntry, ...]:
    """The leading entries whose sizes fit in ``budget_bytes`` (at least one): a peer whose cache
    cannot hold its whole share trains on the part it can hold."""
    kept, used = [], 0
    for entry in entries:
        if kept and used + entry.size > budget_bytes:
            break
        kept.append(entry)
        used += entry.size
    return tuple(kept)


def sample_pool(train_shards: Sequence[ShardEntry], indices: Sequence[int]) -> np.ndarray:
    """The training-split sample indices of the shards ``indices`` (manifest indices), sorted by
    shard index so the pool is the same however the indices are ordered."""
    by_index = {entry.index: entry for entry in train_shards}
    missing = [i for i in indices if i not in by_index]
    if missing:
        raise ValueError(f"shard(s) {missing[:5]} are not training shards of this task")
    ranges = [
        np.arange(by_index[i].first_sample, by_index[i].first_sample + by_index[i].samples, dtype=np.int64)
        for i in sorted(set(indices))
    ]
    if not ranges:
        raise ValueError("a sample pool needs at least one shard")
    return np.concatenate(ranges)
