"""A reducer's second story, found after the others committed, convicts its key for every peer.

Real hivemind DHT nodes that validate MANTA's records, real signed commit boards and real Ed25519
signatures: the victim's report comes after the quorum committed (the reducer held its results
back), a peer's watch reads the attempt again, posts the evidence, and another peer that never saw
the two reports learns the conviction from the DHT; forged evidence never gets stored.
"""

from __future__ import annotations

import time

import pytest

from hivemind_adapter.dht import read_entries, speaker, store
from peer.commit.boards import SignedCommitBoard
from peer.commit.report import CommitReport
from peer.commit.waits import await_commit
from peer.guard.admission import AdmissionMemory
from peer.guard.conviction_watch import ConvictionWatch
from protocol.dht_schema import conviction_subkey, convictions_key, open_conviction_value
from protocol.identity import Identity
from protocol.proof_attestation import Equivocation, ProofAttestation, group_tag, proofs_digest
from protocol.record_lifetimes import CONVICTION_TTL
from protocol.records import ReducerConviction
from protocol.sealing import seal
from tests.helpers import two_task_dhts, wait_until

TASK = "digits-conviction-test"
REDUCER = "QmReducerThatHidAMemberBack"


def _told(reducer: Identity, story: bytes, group: bytes = b"g" * 20) -> str:
    return ProofAttestation.signed(reducer, group_tag(group), REDUCER, proofs_digest(story)).to_token()


@pytest.fixture
def swarm():
    with two_task_dhts(TASK) as dhts:
        identities = [Identity.generate() for _ in dhts]
        boards = [SignedCommitBoard(d, TASK, speaker(d, i)) for d, i in zip(dhts, identities)]
        yield dhts, identities, boards


def test_a_second_story_posted_after_the_commit_convicts_the_reducer_for_every_peer(swarm):
    dhts, identities, (a, b) = swarm
    reducer = Identity.generate()
    keys = {REDUCER: reducer.public_key_hex}
    result = "e1" * 32
    # The quorum (a, and the reducer's own report) commits on the story told to a; b, the victim,
    # gets its results (and its own story) only after that.
    a.post(21, CommitReport(ok=True, digest=result, proofs=(_told(reducer, b"the story told to a"),)))
    assert await_commit(a, 21, result, {a.peer_id}, deadline_seconds=30, public_keys=keys).committed
    watches = [
        ConvictionWatch(d, TASK, i, lambda: keys, recheck_after=(1.5,), read_every=1.0).start()
        for d, i in zip(dhts, identities)
    ]
    try:
        watches[0].recheck_later(a, 21)  # a posted a result for attempt 21
        b.post(
            21, CommitReport(ok=True, digest=result, proofs=(_told(reducer, b"the story told to b"),))
        )  # late, as the victim
        wait_until(lambda: reducer.public_key_hex in watches[0].convicted_keys(), 20, "a's watch to convict")
        assert watches[0].rechecks >= 1
        # b's watch was never asked to read attempt 21: it learns the conviction from the DHT
        wait_until(
            lambda: reducer.public_key_hex in watches[1].convicted_keys(), 20, "b to read a's evidence"
        )
        posted = read_entries(dhts[1], convictions_key(TASK))
        assert list(posted) == [conviction_subkey(reducer.public_key_hex, identities[0].public_key_hex)]
    finally:
        for watch in watches:
            watch.stop()
    # a peer's matchmaking meets no peer of that key, whatever peer id it announces
    admission = AdmissionMemory()
    admitted = admission.update({a.peer_id: "11" * 32, REDUCER: reducer.public_key_hex}, a.peer_id)
    assert set(admitted) == {a.peer_id, REDUCER}
    admission.bar_key(reducer.public_key_hex)
    again = admission.update({a.peer_id: "11" * 32, "QmSameKeyNewId": reducer.public_key_hex}, a.peer_id)
    assert set(again) == {a.peer_id} and {REDUCER, "QmSameKeyNewId"} <= admission.barred()


def test_one_story_told_twice_convicts_nobody(swarm):
    dhts, identities, (a, b) = swarm
    reducer = Identity.generate()
    keys = {REDUCER: reducer.public_key_hex}
    a.post(22, CommitReport(ok=True, digest="e2" * 32, proofs=(_told(reducer, b"one story"),)))
    b.post(22, CommitReport(ok=True, digest="e2" * 32, proofs=(_told(reducer, b"one story"),)))
    watch = ConvictionWatch(dhts[0], TASK, identities[0], lambda: keys, recheck_after=(0.0,), read_every=1.0)
    watch.start()
    try:
        watch.recheck_later(a, 22)
        wait_until(lambda: watch.rechecks >= 1, 15, "the watch to read attempt 22 again")
        time.sleep(1.5)  # a read of the posted convictions too
        assert watch.convicted_keys() == set()
        assert read_entries(dhts[0], convictions_key(TASK)) == {}
    finally:
        watch.stop()


def test_evidence_that_does_not_hold_is_refused_and_never_stored(swarm):
    dhts, identities, _ = swarm
    reducer, framer = Identity.generate(), identities[0]

    def conviction(first: str, second: str, reducer_key: str = reducer.public_key_hex) -> ReducerConviction:
        return ReducerConviction(
            task_id=TASK, public_key=framer.public_key_hex, reducer_key=reducer_key,
            first=first, second=second, timestamp=int(time.time() * 1000),
        )  # fmt: skip

    # the same digest twice, or two all-reduces, are not two stories
    with pytest.raises(ValueError, match="different proofs"):
        conviction(_told(reducer, b"one"), _told(reducer, b"one"))
    with pytest.raises(ValueError, match="one all-reduce"):
        conviction(_told(reducer, b"one"), _told(reducer, b"two", group=b"h" * 20))
    # a story the framer made up in the reducer's name: well formed, but not the reducer's signature
    forged = conviction(_told(reducer, b"told"), _told(framer, b"made up"))
    assert not forged.signatures_hold()
    subkey = conviction_subkey(reducer.public_key_hex, framer.public_key_hex)
    store(dhts[0], convictions_key(TASK), seal(forged, framer), ttl=600, subkey=subkey)
    # filed under a key other than the one that signed: refused too, though its evidence holds
    honest = conviction(_told(reducer, b"told to one"), _told(reducer, b"told to another"))
    assert honest.signatures_hold()
    store(dhts[0], convictions_key(TASK), seal(honest, framer), ttl=600, subkey=f"{'00' * 32}/{'11' * 32}")
    assert read_entries(dhts[1], convictions_key(TASK)) == {}
    assert read_entries(dhts[0], convictions_key(TASK)) == {}
    # and the evidence that holds, filed where it belongs, is stored and read
    store(dhts[0], convictions_key(TASK), seal(honest, framer), ttl=600, subkey=subkey)
    assert list(read_entries(dhts[1], convictions_key(TASK))) == [subkey]
    with pytest.raises(ValueError, match="may not be sealed"):
        seal(honest, reducer)  # a record names its poster: nobody else can seal it


def test_evidence_posted_again_at_half_its_life_is_signed_anew_and_stored(swarm):
    """A stored copy lives CONVICTION_TTL from its signed time (protocol.record_lifetimes): the same
    record re-posted three hours on would be refused, so the watch re-signs it."""
    dhts, identities, _ = swarm
    reducer = Identity.generate()
    keys = {REDUCER: reducer.public_key_hex}
    watch = ConvictionWatch(dhts[0], TASK, identities[0], lambda: keys, read_every=1.0)
    tokens = [ProofAttestation.from_token(_told(reducer, story)) for story in (b"to one", b"to another")]
    assert watch.report(Equivocation(REDUCER, "g" * 8, *tokens, "QmFirstPoster", "QmSecondPoster"))
    subkey = conviction_subkey(reducer.public_key_hex, identities[0].public_key_hex)
    wait_until(lambda: subkey in read_entries(dhts[1], convictions_key(TASK)), 15, "the evidence stored")
    first = open_conviction_value(TASK, subkey, read_entries(dhts[1], convictions_key(TASK))[subkey])
    # three hours and a second on, as the watch's clock sees it
    record, _ = watch._posted[reducer.public_key_hex]
    watch._posted[reducer.public_key_hex] = (record, time.monotonic() - CONVICTION_TTL / 2 - 1)
    watch._refresh_own()

    def stored_again():
        entries = read_entries(dhts[1], convictions_key(TASK))
        return (
            subkey in entries and open_conviction_value(TASK, subkey, entries[subkey]).record != first.record
        )

    wait_until(stored_again, 15, "the evidence posted again")
    again = open_conviction_value(TASK, subkey, read_entries(dhts[1], convictions_key(TASK))[subkey]).record
    assert again.timestamp > first.record.timestamp
    assert (again.first, again.second) == (first.record.first, first.record.second)
