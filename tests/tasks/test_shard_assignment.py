"""Which shards each peer trains on: every shard of an epoch has exactly one owner among the roster,
everyone computes the same owners, a joiner moves only the shards it wins, and a receipt's shards
give back the same sample pool."""

from __future__ import annotations

import numpy as np
import pytest

from protocol.shards import ShardEntry
from tasks.shard_assignment import (
    assigned_shards,
    epoch_of_round,
    rounds_per_epoch,
    sample_pool,
    within_budget,
)
from tasks.sharding import SampleStream

ROSTER = [f"12D3KooWpeer{i:02d}" for i in range(4)]
SHARDS = list(range(40))


def _owners(roster, epoch, shards=SHARDS, seed=7):
    return {peer: set(assigned_shards(shards, seed, epoch, roster, peer)) for peer in roster}


def test_every_shard_of_an_epoch_has_exactly_one_owner():
    for epoch in range(3):
        owners = _owners(ROSTER, epoch)
        everything = [s for mine in owners.values() for s in mine]
        assert sorted(everything) == SHARDS  # covered, and no shard twice
        assert all(owners.values()), "with 40 shards and 4 peers every peer gets some"


def test_the_roster_order_does_not_matter_and_epochs_deal_anew():
    shuffled = list(reversed(ROSTER))
    assert _owners(ROSTER, 1) == _owners(shuffled, 1)
    assert _owners(ROSTER, 1) != _owners(ROSTER, 2)


def test_a_joiner_takes_shards_only_from_others_and_moves_nothing_else():
    before = _owners(ROSTER, 0)
    joiner = "12D3KooWjoiner"
    after = _owners([*ROSTER, joiner], 0)
    for peer in ROSTER:
        assert after[peer] <= before[peer]  # nobody gains a shard when someone joins
    moved = sum(len(before[p] - after[p]) for p in ROSTER)
    assert moved == len(after[joiner])


def test_a_peer_not_yet_in_the_roster_computes_its_share_as_if_it_were():
    joiner = "12D3KooWjoiner"
    assert assigned_shards(SHARDS, 7, 0, ROSTER, joiner) == assigned_shards(
        SHARDS, 7, 0, [*ROSTER, joiner], joiner
    )


def test_more_peers_than_shards_still_gives_everyone_a_shard():
    roster = [f"12D3KooWmany{i:02d}" for i in range(10)]
    for peer in roster:
        assert len(assigned_shards([0, 1, 2], 7, 0, roster, peer)) >= 1


def _entries(sizes, per_shard=10):
    return [
        ShardEntry(index=i, split="train", digest=f"{i:064x}", size=size, first_sample=i * per_shard,
                   samples=per_shard, format="image/png", decoded_shape=(3, 8, 8), decoded_bytes=per_shard * 192)
        for i, size in enumerate(sizes)
    ]  # fmt: skip


def test_the_pool_is_the_shards_samples_whatever_their_order():
    entries = _entries([100] * 5)
    pool = sample_pool(entries, [3, 1])
    assert pool.tolist() == list(range(10, 20)) + list(range(30, 40))
    assert np.array_equal(pool, sample_pool(entries, [1, 3]))
    with pytest.raises(ValueError, match="not training shards"):
        sample_pool(entries, [9])


def test_a_stream_on_a_pool_draws_only_from_it_and_replays_the_same():
    pool = sample_pool(_entries([100] * 5), [0, 4])
    first = SampleStream(50, 3, 2, "peer/0", pool).take(45)
    assert set(first.tolist()) <= set(pool.tolist())
    assert len(set(first[:20].tolist())) == 20  # a permutation of the pool: no repeat within it
    assert np.array_equal(first, SampleStream(50, 3, 2, "peer/0", pool).take(45))


def test_a_budget_keeps_the_leading_shards_that_fit_and_at_least_one():
    entries = _entries([40, 40, 40, 40])
    assert [e.index for e in within_budget(entries, 100)] == [0, 1]
    assert [e.index for e in within_budget(entries, 10)] == [0]


def test_epochs_are_the_rounds_one_pass_over_the_data_takes():
    assert rounds_per_epoch(1000, 256) == 4
    assert [epoch_of_round(r, 1000, 256) for r in (0, 3, 4, 9)] == [0, 0, 1, 2]
