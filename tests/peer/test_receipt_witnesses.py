"""A receipt's witnesses travel with it: an aggregator that first sees a receipt after its group's
commit reports expired from the board (it was down meanwhile) credits it on the reports its sender
kept, and on nothing a sender could forge. Real DHT nodes, real endpoints, a real desk and ledger."""

from __future__ import annotations

import pytest

from aggregator.contributions import ContributionDesk
from hivemind_adapter.dht import peer_id, read_entries, speaker, store
from hivemind_adapter.p2p import Endpoint
from peer.commit.boards import SignedCommitBoard
from peer.commit.report import CommitReport
from peer.receipts import AggregatorLink, ReceiptCourier, ReceiptOutbox
from protocol.averaging_group import averaging_group_id, group_membership
from protocol.dht_schema import commits_key, peers_key
from protocol.identity import Identity
from protocol.record_lifetimes import ANNOUNCE_TTL
from protocol.records import Affinity, DeviceInfo, PeerAnnouncement, RoundCommit
from protocol.sealing import seal
from protocol.witness_bundle import MAX_REPORTS, WitnessBundle
from tests.helpers import two_task_dhts, wait_until
from tests.protocol.factories import (
    TASK,
    certificate_wire,
    endorsement_of,
    group_fields,
    now_ms,
    peer_id_of,
    receipt,
    receipt_wire,
    speaker_binding_wire,
    speaker_of,
    task_spec,
)

ATTEMPT = 7
REPORT_TTL = 4.0  # the board's reports, short-lived here (90 s in a swarm)


def _announce(dht, identity: Identity) -> None:
    """``identity``'s peer entry for ``dht``'s peer id (the intake refuses receipts without one), for
    ANNOUNCE_TTL seconds: a running peer refreshes it more often."""
    record = PeerAnnouncement(
        task_id=TASK, peer_id=peer_id(dht), public_key=identity.public_key_hex,
        devices=(DeviceInfo(kind="cpu", name="test cpu", memory_mb=1024),), throughput_milli=100_000,
        affinity=Affinity(host_id="ab" * 8, network_id="cd" * 8), cohort_id="auto", timestamp=now_ms(),
    )  # fmt: skip
    value = [
        seal(record, identity),
        speaker_binding_wire(speaker(dht, identity)),
        certificate_wire(identity, peer_id=peer_id(dht)),
    ]
    assert store(dht, peers_key(TASK), value, ttl=ANNOUNCE_TTL, subkey=identity.public_key_hex)


def _receipt_of_a_committed_group(dht, sender: Identity, partner: Identity, seq: int) -> tuple[bytes, str]:
    """A receipt of ``sender`` (sending from ``dht``) for a group it formed with ``partner`` in
    ``ATTEMPT``, and the group's id; both post their signed commit reports, as after a commit."""
    me = peer_id(dht)
    membership = group_membership([(me, 64), (peer_id_of(partner), 64)], me)
    state = f"{seq:064x}"
    group = averaging_group_id(TASK, ATTEMPT, membership, state)
    record = receipt(
        sender, seq, peer_id=me, round=0, attempt=ATTEMPT, samples=64, state_digest=state, group_id=group,
        grad_sketch=(12, -7, 3), worker_samples=(64,),
        **group_fields(membership),
    )  # fmt: skip
    for identity in (sender, partner):
        board = SignedCommitBoard(dht, TASK, speaker_of(identity), ttl=REPORT_TTL)
        board.post(ATTEMPT, CommitReport(ok=True, digest="ef" * 32, group=group))
    return seal(record, sender), group


def test_a_receipt_first_delivered_after_its_reports_expired_is_credited_on_the_witnesses_it_kept(tmp_path):
    aggregator, sender, partner = Identity.generate(), Identity.generate(), Identity.generate()
    with two_task_dhts(TASK) as (desk_dht, peer_dht):
        _announce(peer_dht, sender)
        wire, group = _receipt_of_a_committed_group(peer_dht, sender, partner, seq=1)
        outbox = ReceiptOutbox(tmp_path / "receipts", sender)
        outbox.add(receipt(sender, 1), wire)
        path = outbox.pending()[0][0]
        endpoint = Endpoint(peer_dht, "peer")
        link = AggregatorLink(peer_dht, endpoint, TASK, (aggregator.public_key_hex,))
        binding = speaker_binding_wire(speaker(peer_dht, sender))
        courier = ReceiptCourier(outbox, link, binding, interval=3600.0)  # only the deliveries called here
        try:
            courier.deliver_once()  # no aggregator yet: the witnesses are kept, nothing is delivered
            kept = WitnessBundle.from_bytes(outbox.witnesses(path))
            assert (kept.attempt, kept.group) == (ATTEMPT, group)
            assert (
                len(kept.reports) == 1 and partner.public_key_hex.encode() in kept.reports[0]
            )  # not its own
            wait_until(
                lambda: not read_entries(desk_dht, commits_key(TASK, ATTEMPT)), 30, "the reports to expire"
            )
            desk_endpoint = Endpoint(desk_dht, "desk")
            desk = ContributionDesk(
                desk_dht, desk_endpoint, aggregator, task_spec(aggregator), tmp_path / "l.sqlite"
            )
            _announce(peer_dht, sender)  # refreshed, as the running peer does
            try:
                courier.deliver_once()  # submitted: the desk found no report on the board, and took the kept one
                assert desk.witness.witnesses(ATTEMPT, group) == {partner.public_key_hex}
                desk.close_due_rounds(force=True)
                courier.deliver_once()  # the proof of inclusion
                assert [p.name for p in (tmp_path / "receipts" / "settled").glob("*.receipt")] == [path.name]
                assert (tmp_path / "receipts" / "settled" / path.with_suffix(".witnesses").name).exists()
                assert desk.counters["accepted"] == 1, dict(desk.counters)
            finally:
                desk.shutdown()
                desk_endpoint.close()
        finally:
            courier.stop()
            endpoint.close()


@pytest.fixture(scope="module")
def desk_after_a_read(tmp_path_factory):
    """A desk that read attempt ``ATTEMPT`` from the board (as each receipt's arrival makes it);
    one for the module's tests, which only add what they check to its memory."""
    aggregator = Identity.generate()
    with two_task_dhts(TASK) as (desk_dht, _):
        endpoint = Endpoint(desk_dht, "desk")
        desk = ContributionDesk(
            desk_dht,
            endpoint,
            aggregator,
            task_spec(aggregator),
            tmp_path_factory.mktemp("desk") / "l.sqlite",
        )
        try:
            desk.witness.read([ATTEMPT])
            yield desk
        finally:
            desk.shutdown()
            endpoint.close()


def _report(identity: Identity, group: str, attempt: int = ATTEMPT, ok: bool = True) -> bytes:
    record = RoundCommit(
        task_id=TASK, attempt=attempt, peer_id=peer_id_of(identity), public_key=identity.public_key_hex,
        endorsement=endorsement_of(identity), ok=ok,
        digest="ef" * 32, timestamp=now_ms(), group=group,
    )  # fmt: skip
    return seal(record, identity)


def test_a_bundle_teaches_only_signed_reports_of_its_own_attempt_and_group(desk_after_a_read):
    desk, group = desk_after_a_read, "ab" * 32
    honest, other, forger = Identity.generate(), Identity.generate(), Identity.generate()
    forged = _report(honest, group).replace(b'"ok":true', b'"ok":false')  # its signature no longer holds
    bundle = WitnessBundle(
        ATTEMPT,
        group,
        (
            _report(honest, group),
            _report(other, "cd" * 32),  # another group's
            _report(other, group, attempt=ATTEMPT + 1),  # another attempt's
            _report(forger, group, ok=False),  # a failure is no commit
            forged,
            b"not a record",
        ),
    )
    reply = desk.take_witnesses(bundle.to_bytes(), "QmSomeone")
    assert reply == {"status": "ok", "learned": 1}
    assert desk.witness.witnesses(ATTEMPT, group) == {honest.public_key_hex}
    # far from what the board was read for: ignored, so a flood cannot push real attempts out
    far = WitnessBundle(ATTEMPT + 10_000, group, (_report(other, group, attempt=ATTEMPT + 10_000),))
    assert desk.take_witnesses(far.to_bytes(), "QmSomeone") == {"status": "ok", "learned": 0}
    assert not desk.witness.known(ATTEMPT + 10_000)


def test_a_refused_receipt_moves_no_witness_window(desk_after_a_read):
    """A throw-away key's receipt for attempt 10^6 is refused at intake (its sender bound no key)
    before the desk reads that attempt's reports: a read would move the window bundles are taken in,
    and every honest sender's kept reports would be ignored from then on."""
    desk, group = desk_after_a_read, "12" * 32
    thrower = Identity.generate()
    reply = desk.submit(receipt_wire(thrower, 1, attempt=10**6), peer_id_of(thrower))
    assert reply["status"] == "rejected", reply
    honest = Identity.generate()
    bundle = WitnessBundle(ATTEMPT, group, (_report(honest, group),))
    assert desk.take_witnesses(bundle.to_bytes(), "QmSomeone") == {"status": "ok", "learned": 1}


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"[]",
        b'{"attempt": 7, "group": "ab", "reports": "00"}',
        b'{"attempt": -1, "group": "ab", "reports": []}',
        b'{"attempt": 7, "group": "ab", "reports": ["zz"]}',
        b'{"attempt": 7, "group": "ab", "reports": [], "extra": 1}',
        b"x" * (2 * 1024 * 1024),
    ],
)
def test_a_malformed_bundle_is_refused_with_its_reason(desk_after_a_read, data):
    reply = desk_after_a_read.take_witnesses(data, "QmSomeone")
    assert reply["status"] == "rejected" and reply["detail"], reply


def test_a_bundle_round_trips_and_holds_at_most_its_limit():
    bundle = WitnessBundle(3, "ab" * 32, (b"one", b"two"))
    assert WitnessBundle.from_bytes(bundle.to_bytes()) == bundle
    with pytest.raises(ValueError, match="at most"):
        WitnessBundle(3, "ab", (b"x",) * (MAX_REPORTS + 1)).to_bytes()
    with pytest.raises(ValueError, match="bytes, at most"):
        WitnessBundle.from_bytes(b"{" * (64 * 1024 * 1024))  # by its size, before any parse
