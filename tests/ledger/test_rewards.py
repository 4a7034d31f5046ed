"""Rewards are a pure function of the log: samples x FLOPs per sample, minus revoked entries."""

from __future__ import annotations

import pytest

from ledger.rewards import RewardTally, compute_rewards
from ledger.store import LedgerStore
from protocol.identity import Identity
from protocol.merkle import leaf_hash
from protocol.records import Revocation
from protocol.sealing import seal
from tests.ledger.helpers import AGGREGATOR, PEERS, build_ledger
from tests.protocol.factories import peer_id_of, receipt_wire


def _revocation(index: int, leaf: bytes, signer=AGGREGATOR, reason: str = "audit") -> bytes:
    record = Revocation(
        task_id="t", entry_index=index, entry_leaf_hash=leaf.hex(), reason=reason, timestamp=1
    )
    return seal(record, signer)


def test_credit_is_samples_times_training_flops_per_sample():
    small, big = PEERS[0], PEERS[1]
    entries = [
        receipt_wire(small, 1, samples=1000, flops_per_sample=3 * 10**6),
        receipt_wire(big, 1, samples=1000, flops_per_sample=3 * 4 * 10**6),  # a 4x bigger sub-network
        receipt_wire(small, 2, samples=500, flops_per_sample=3 * 10**6),
    ]
    table = compute_rewards(entries)
    by_key = {p.public_key: p for p in table.peers}
    assert by_key[small.public_key_hex].credits == 1500 * 3 * 10**6
    assert by_key[big.public_key_hex].credits == 1000 * 12 * 10**6
    assert (
        by_key[big.public_key_hex].credits / 1000 > by_key[small.public_key_hex].credits / 1500
    )  # more per sample
    assert table.total_credits == 16.5 * 10**9 and table.receipts == 3
    assert [p.public_key for p in table.peers] == [
        big.public_key_hex,
        small.public_key_hex,
    ]  # most credit first
    assert sum(p.share for p in table.peers) == pytest.approx(1.0)
    assert by_key[small.public_key_hex].entries == 2
    assert by_key[small.public_key_hex].peer_ids == (peer_id_of(small),)
    assert by_key[small.public_key_hex].fingerprint == small.fingerprint


def test_a_revocation_cancels_exactly_the_entry_it_names():
    entries = [
        receipt_wire(PEERS[0], 1, samples=10, flops_per_sample=7),
        receipt_wire(PEERS[0], 2, samples=20, flops_per_sample=7),
    ]
    entries.append(_revocation(1, leaf_hash(entries[1])))
    table = compute_rewards(entries, AGGREGATOR.public_key)
    (peer,) = table.peers
    assert (peer.credits, peer.entries, peer.revoked) == (70, 1, 1)
    assert table.revocations == 1 and table.ignored_revocations == 0

    ignored = [
        _revocation(0, leaf_hash(entries[1])),  # index and leaf hash disagree
        _revocation(2, leaf_hash(entries[2])),  # names a revocation, not a receipt
        _revocation(0, leaf_hash(entries[0]), signer=PEERS[0]),  # not sealed by the log's key
    ]
    twice = _revocation(1, leaf_hash(entries[1]), reason="again")  # revoking twice changes nothing
    table = compute_rewards([*entries, *ignored, twice], AGGREGATOR.public_key)
    assert (table.peers[0].credits, table.revocations, table.ignored_revocations) == (70, 1, 3)
    # without a pinned log key, a revocation by any key counts
    assert compute_rewards([*entries, *ignored]).peers[0].credits == 0


def test_rewards_are_a_pure_function_of_the_ledger(tmp_path):
    wires = build_ledger(tmp_path / "l.db", batches=3, revoke=6)
    with LedgerStore.open(tmp_path / "l.db", readonly=True) as store:
        from_store = compute_rewards((d for _, d in store.entries()), store.log_public_key)
    assert (
        from_store
        == compute_rewards(wires, AGGREGATOR.public_key)
        == compute_rewards(list(wires), AGGREGATOR.public_key)
    )
    by_fp = {p.fingerprint: p for p in from_store.peers}
    # peer k trains (k+1)x bigger sub-networks, 100 samples a round, 3 rounds; entry 6 (peer 1, round 1) revoked
    assert by_fp[PEERS[0].fingerprint].credits == 3 * 100 * 1_000_000
    assert by_fp[PEERS[1].fingerprint].credits == 2 * 100 * 2_000_000
    assert by_fp[PEERS[1].fingerprint].revoked == 1
    assert by_fp[PEERS[4].fingerprint].credits == 3 * 100 * 5_000_000


def test_an_unreadable_entry_is_an_error():
    with pytest.raises(ValueError, match="entry 1"):
        compute_rewards([receipt_wire(Identity.generate(), 1), b"junk"])


def test_a_tally_fed_one_entry_at_a_time_is_the_table_of_every_prefix(tmp_path):
    wires = build_ledger(tmp_path / "l.db", batches=3, revoke=6)
    wires += [_revocation(6, leaf_hash(wires[6])), _revocation(0, leaf_hash(wires[1]))]  # twice; ignored
    tally = RewardTally(AGGREGATOR.public_key)
    for n, data in enumerate(wires, start=1):
        tally.add(data)
        assert tally.size == n
        assert tally.rewards() == compute_rewards(wires[:n], AGGREGATOR.public_key)
    assert tally.revoked(6) and not tally.revoked(5)
