"""Deterministic sharding: no overlap within a round, even coverage over rounds."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from tasks.sharding import epoch_permutation, round_slice, rounds_per_epoch, shard_indices, split_counts

PEERS = [f"{peer}/{worker}" for peer in ("QmPeerB", "QmPeerA", "QmPeerC") for worker in range(2)]


def test_participants_never_overlap_within_a_round():
    for round_ in range(12):
        shards = [shard_indices(1000, 7, round_, PEERS, p, round_size=300) for p in PEERS]
        flat = np.concatenate(shards)
        assert len(flat) == len(set(flat.tolist())) == len(round_slice(1000, 7, round_, 300))
        assert max(map(len, shards)) - min(map(len, shards)) <= 1


def test_rounds_cover_every_sample_once_per_epoch_whoever_participates():
    n, size = 1003, 128
    per_epoch = rounds_per_epoch(n, size)
    assert per_epoch == 8
    rng = np.random.default_rng(0)
    counts = Counter()
    for round_ in range(3 * per_epoch):
        members = [p for p in PEERS if rng.random() < 0.7] or PEERS[:1]  # peers come and go
        for p in members:
            counts.update(shard_indices(n, "task-seed", round_, members, p, round_size=size).tolist())
        if (round_ + 1) % per_epoch == 0:
            epochs = (round_ + 1) // per_epoch
            assert set(counts) == set(range(n)) and set(counts.values()) == {epochs}
    sizes = [len(round_slice(n, "task-seed", r, size)) for r in range(per_epoch)]
    assert sum(sizes) == n and max(sizes) - min(sizes) <= 1 and max(sizes) <= size


def test_deterministic_and_independent_of_participant_order():
    a = shard_indices(500, 3, 4, PEERS, "QmPeerA/1", round_size=100)
    b = shard_indices(500, 3, 4, list(reversed(PEERS)) + ["QmPeerA/1"], "QmPeerA/1", round_size=100)
    assert np.array_equal(a, b) and a.dtype == np.int64
    assert not np.array_equal(epoch_permutation(500, 3, 0), epoch_permutation(500, 4, 0))
    assert not np.array_equal(epoch_permutation(500, 3, 0), epoch_permutation(500, 3, 1))
    assert np.array_equal(np.sort(epoch_permutation(500, 3, 2)), np.arange(500))
    # default round size: one epoch per round, split among participants
    whole = np.concatenate([shard_indices(60, 1, 0, PEERS, p) for p in sorted(PEERS)])
    assert np.array_equal(np.sort(whole), np.arange(60))


def test_weighted_shares():
    weights = {p: (3.0 if p.startswith("QmPeerA") else 1.0) for p in PEERS}
    shards = {p: shard_indices(800, 1, 0, PEERS, p, round_size=800, weights=weights) for p in PEERS}
    assert sum(map(len, shards.values())) == 800
    assert len(shards["QmPeerA/0"]) == 240 and len(shards["QmPeerB/0"]) == 80
    assert split_counts(10, ["a", "b", "c"], {"a": 1, "b": 1, "c": 1}) == [4, 3, 3]
    with pytest.raises(ValueError, match=r"^weights\['b'\]"):
        split_counts(10, ["a", "b"], {"a": 1})


def test_bad_arguments():
    with pytest.raises(ValueError, match="^participant:"):
        shard_indices(10, 0, 0, ["a/0"], "b/0")
    with pytest.raises(ValueError, match="^participants"):
        shard_indices(10, 0, 0, [], "a/0")
    with pytest.raises(ValueError, match="^round"):
        shard_indices(10, 0, -1, ["a/0"], "a/0")
    with pytest.raises(ValueError, match="^dataset_size"):
        shard_indices(0, 0, 0, ["a/0"], "a/0")
