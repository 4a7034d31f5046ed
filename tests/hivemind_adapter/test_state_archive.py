"""States fetched by digest from the peers that hold them, over real libp2p: several pages, checked
against the digest, the next holder tried when one cannot serve, only the newest kept, and a
state's head (its parameters) fetched and checked without the rest."""

from __future__ import annotations

import pytest
import torch

from hivemind_adapter.paged_blobs import BlobUnavailable
from hivemind_adapter.state_archive import decode_state, encode_state, fetch_state, fetch_state_head
from supernet.state import digest, tensor_hashes
from tests.hivemind_adapter.archive_pair import archive_and_client

TASK = "archive-test"


def _state(seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    # about 2.4 MB: several 1 MiB pages
    return [
        torch.randn(600, 1000, generator=g),
        torch.randn(17, generator=g),
        torch.arange(5, dtype=torch.int64),
    ]


def test_a_state_round_trips_through_its_encoding():
    state = _state(0)
    round_index, attempt, back = decode_state(encode_state(7, 11, state), state)
    assert (round_index, attempt) == (7, 11) and all(torch.equal(a, b) for a, b in zip(state, back))
    with pytest.raises(ValueError, match="bytes"):
        decode_state(encode_state(7, 11, state)[:-1], state)


@pytest.fixture
def two_nodes():
    with archive_and_client(TASK) as nodes:
        yield nodes


def test_a_state_is_fetched_by_digest_checked_and_only_the_newest_are_kept(two_nodes):
    archive, server, client = two_nodes
    states = [_state(i) for i in range(3)]
    digests = [digest(s[:2]) for s in states]  # the first two tensors are the consensus part
    for i, (s, d) in enumerate(zip(states, digests)):
        archive.add(i, 100 + i, d, s, consensus=2)
    assert archive.digests() == {digests[1]: 1, digests[2]: 2}  # keep=2: round 0 is gone

    got = fetch_state(client, [client.peer_id, server], TASK, digests[2], states[0], consensus=2)
    assert (got.round, got.attempt, got.digest) == (2, 102, digests[2])
    assert all(torch.equal(a, b) for a, b in zip(got.tensors, states[2]))
    assert archive.bytes_served >= 2_400_000  # every page crossed once (the client itself held nothing)

    with pytest.raises(BlobUnavailable, match="does not hold that blob"):
        fetch_state(client, [server], TASK, digests[0], states[0], consensus=2)
    # A server whose copy does not hash to the digest it is asked for is not believed.
    archive._server.put(digests[1], encode_state(1, 101, states[2]))
    with pytest.raises(BlobUnavailable, match="served a state with digest"):
        fetch_state(client, [server], TASK, digests[1], states[0], consensus=2)


def test_a_state_with_non_finite_values_outside_its_digest_is_not_loaded(two_nodes):
    """The digest covers the consensus tensors only; what follows (batch-norm statistics) is the
    holder's own, and a NaN there would poison the model that loads it."""
    archive, server, client = two_nodes
    state = _state(5)
    state[1][3] = float("nan")  # outside the digest of the first tensor (consensus=1)
    archive.add(4, 104, digest(state[:1]), state, consensus=1)
    with pytest.raises(BlobUnavailable, match="non-finite"):
        fetch_state(client, [server], TASK, digest(state[:1]), _state(0), consensus=1)


def test_a_state_head_is_fetched_alone_and_checked_against_the_state_digest(two_nodes):
    """An audit needs the parameters only: the index (checked against the digest) vouches for them,
    and the rest of the state never crosses the link. A wrong index or head is not believed."""
    archive, server, client = two_nodes
    g = torch.Generator().manual_seed(3)
    state = [torch.randn(300, 1000, generator=g), torch.randn(600, 1000, generator=g), torch.arange(5)]
    state_digest = digest(state[:2])
    archive.add(9, 3, state_digest, state, consensus=2)
    got = fetch_state_head(client, [server], TASK, state_digest, [torch.zeros(300, 1000)], consensus=2)
    assert (got.round, got.attempt, got.digest) == (9, 3, digest(state[:1]))
    assert len(got.tensors) == 1 and torch.equal(got.tensors[0], state[0])
    assert 1_200_000 <= archive.bytes_served < 1_300_000  # 1.2 MB of parameters and 64 bytes of index

    other = [t + 1 for t in state]
    archive._head_server.put(digest(state[:1]), encode_state(9, 3, other[:1]))
    with pytest.raises(BlobUnavailable, match="not state"):
        fetch_state_head(client, [server], TASK, state_digest, [torch.zeros(300, 1000)], consensus=2)
    archive._index_server.put(state_digest, b"".join(tensor_hashes(other[:2])))
    with pytest.raises(BlobUnavailable, match="index that is not"):
        fetch_state_head(client, [server], TASK, state_digest, [torch.zeros(300, 1000)], consensus=2)
    with pytest.raises(BlobUnavailable, match="does not hold that blob"):
        fetch_state_head(client, [server], TASK, digest(other[:2]), [torch.zeros(300, 1000)], consensus=2)
