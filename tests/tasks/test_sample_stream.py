"""Open-ended per-participant sample streams (swarm rounds that close on a global sample count)."""

from __future__ import annotations

import numpy as np

from tasks.sharding import SampleStream, augmentation_seed, stream_indices


def test_a_stream_is_deterministic_and_taking_in_pieces_changes_nothing():
    whole = stream_indices(100, 7, 3, "peer/0", 250)
    stream = SampleStream(100, 7, 3, "peer/0")
    pieces = np.concatenate([stream.take(32) for _ in range(7)] + [stream.take(26)])
    assert np.array_equal(whole, pieces) and stream.position == 250


def test_no_sample_repeats_before_the_dataset_was_seen_once():
    idx = stream_indices(100, 7, 3, "peer/0", 300)
    for block in range(3):
        assert sorted(idx[block * 100 : (block + 1) * 100]) == list(range(100))


def test_streams_differ_by_participant_round_and_seed():
    base = stream_indices(1000, 7, 3, "peer/0", 64)
    for other in (
        stream_indices(1000, 7, 3, "peer/1", 64),
        stream_indices(1000, 7, 4, "peer/0", 64),
        stream_indices(1000, 8, 3, "peer/0", 64),
    ):
        assert not np.array_equal(base, other)
    assert augmentation_seed(7, 3, "peer/0") != augmentation_seed(7, 3, "peer/1")
    assert 0 <= augmentation_seed(7, 3, "peer/0") < 2**63
