"""ContributionIntake: every rejection reason is refused, counted, and leaves nothing in the ledger."""

from __future__ import annotations

import json
import random

import pytest

from aggregator.intake import ContributionIntake, Submission
from ledger.errors import LedgerError
from ledger.store import LedgerStore
from protocol.canonical import canonical_json
from protocol.identity import Identity
from protocol.merkle import leaf_hash
from protocol.peer_keys import Libp2pKey
from protocol.records import IdentityBinding
from protocol.sealing import RecordRejected, RejectReason
from tests.ledger.helpers import AGGREGATOR, ORIGIN
from tests.protocol.factories import (
    TASK,
    binding_wire,
    fake_peer_id,
    now_ms,
    peer_id_of,
    receipt_wire,
    resign,
    seal_unchecked,
)

PEER = Identity.from_seed(b"\x07" * 32)
OTHER = Identity.from_seed(b"\x08" * 32)


@pytest.fixture
def store(tmp_path):
    with LedgerStore.open(
        tmp_path / "l.db", create=True, origin=ORIGIN, log_public_key=AGGREGATOR.public_key
    ) as s:
        yield s


def _body_edit(wire: bytes, **changes) -> bytes:
    body = json.loads(wire.split(b"\n")[1])
    body.update(changes)
    return resign(wire, PEER, json.dumps(body, sort_keys=True, separators=(",", ":")).encode())


# Each case: (receipts accepted first, the offending submission, intake options).
CASES = {
    RejectReason.MALFORMED: lambda: ([], b"manta/receipt/v1\n{}", {}),
    RejectReason.UNKNOWN_FIELD: lambda: ([], _body_edit(receipt_wire(PEER, 1), extra_credit=1), {}),
    RejectReason.WRONG_TYPE: lambda: ([], _body_edit(receipt_wire(PEER, 1), samples="256"), {}),
    RejectReason.OVERSIZE: lambda: ([], _body_edit(receipt_wire(PEER, 1), cohort_id="c" * 300), {}),
    RejectReason.NON_CANONICAL: lambda: (
        [],
        resign(
            receipt_wire(PEER, 1),
            PEER,
            canonical_json(json.loads(receipt_wire(PEER, 1).split(b"\n")[1])) + b" ",
        ),
        {},
    ),
    RejectReason.WRONG_RECORD: lambda: ([], binding_wire(PEER), {}),
    RejectReason.UNSUPPORTED_VERSION: lambda: ([], receipt_wire(PEER, 1).replace(b"/v2\n", b"/v9\n", 1), {}),
    RejectReason.BAD_SIGNATURE: lambda: (
        [],
        receipt_wire(PEER, 1).replace(b'"samples":256', b'"samples":257'),
        {},
    ),
    RejectReason.WRONG_TASK: lambda: ([], receipt_wire(PEER, 1, task_id="another-task"), {}),
    RejectReason.REPLAY: lambda: ([receipt_wire(PEER, 1)], "the first one again", {}),
    RejectReason.OUT_OF_ORDER: lambda: ([receipt_wire(PEER, 5)], receipt_wire(PEER, 4), {}),
    RejectReason.STALE_TIMESTAMP: lambda: ([], receipt_wire(PEER, 1, timestamp=now_ms() - 3_600_000), {}),
    RejectReason.UNBOUND_PEER: lambda: ([], receipt_wire(PEER, 1), {"require_binding": True}),
}


# Reasons that need a live swarm's context (rounds, groups, announcements, audits) are decided by
# aggregator/contribution_checks.py and tested in tests/aggregator/test_contribution_checks.py.
SWARM_REASONS = {
    RejectReason.ROUND_WINDOW,
    RejectReason.GROUP_MISMATCH,
    RejectReason.IMPLAUSIBLE,
    RejectReason.NON_FINITE,
    RejectReason.AUDIT_FAILED,
    RejectReason.MISPRICED,  # tests/aggregator/test_work_pricing.py
    RejectReason.UNWITNESSED,
    RejectReason.EXCLUDED,  # the desk's (tests/aggregator/test_trust.py)
    RejectReason.AUDIT_UNAVAILABLE,  # in older ledgers only
    RejectReason.NOT_ADMITTED,  # DHT entries (tests/protocol/test_membership.py)
    RejectReason.OUTLIER,
    RejectReason.EQUIVOCATED,  # from the commit reports' attestations
}


def test_every_reject_reason_has_a_case():
    assert set(CASES) == set(RejectReason) - SWARM_REASONS


@pytest.mark.parametrize("reason", list(CASES), ids=lambda r: r.value)
def test_each_reason_is_refused_counted_and_not_written(store, reason):
    first, bad, options = CASES[reason]()
    intake = ContributionIntake(store, AGGREGATOR, TASK, **options)
    if first:
        assert len(intake.admit(first).accepted) == len(first)
    if bad == "the first one again":
        bad = first[0]
    size = store.size
    result = intake.admit([bad])
    assert result.accepted == []
    assert [(r.position, r.reason) for r in result.rejected] == [(0, reason)]
    assert result.rejected[0].detail and "\n" not in result.rejected[0].detail
    assert intake.counters[reason.value] == 1
    assert intake.counters["accepted"] == len(first)
    assert store.size == size  # nothing of the rejected submission was written
    if bad != (first[0] if first else None):
        assert store.index_of(leaf_hash(bad)) is None
    assert result.checkpoint.size == size  # the round still gets its checkpoint


def test_a_mixed_batch_appends_only_the_good_ones_in_a_deterministic_order(tmp_path):
    peers = [Identity.generate() for _ in range(6)]
    good = [receipt_wire(p, seq, round=seq % 2) for p in peers for seq in (1, 2)]
    bad = [receipt_wire(PEER, 1, task_id="other"), b"junk", good[0]]
    roots = []
    for attempt in range(3):
        subs = good + bad
        random.Random(attempt).shuffle(subs)
        with LedgerStore.open(
            tmp_path / f"l{attempt}.db", create=True, origin=ORIGIN, log_public_key=AGGREGATOR.public_key
        ) as store:
            intake = ContributionIntake(store, AGGREGATOR, TASK)
            result = intake.admit(subs)
            assert len(result.accepted) == 12 and len(result.rejected) == 3
            assert intake.counters == {"accepted": 12, "wrong_task": 1, "malformed": 1, "replay": 1}
            keys = [(s.public_key, s.record.seq) for s in result.accepted]
            assert keys == sorted(keys)
            roots.append(store.root())
    assert roots[0] == roots[1] == roots[2]


def test_replays_are_refused_after_a_restart(tmp_path):
    path = tmp_path / "l.db"
    wire = receipt_wire(PEER, 3)
    with LedgerStore.open(path, create=True, origin=ORIGIN, log_public_key=AGGREGATOR.public_key) as store:
        assert ContributionIntake(store, AGGREGATOR, TASK).admit([wire]).accepted
    with LedgerStore.open(path) as store:
        intake = ContributionIntake(store, AGGREGATOR, TASK)
        result = intake.admit([wire, receipt_wire(PEER, 2), receipt_wire(PEER, 4)])
        assert [r.reason for r in result.rejected] == [RejectReason.REPLAY, RejectReason.OUT_OF_ORDER]
        assert [s.record.seq for s in result.accepted] == [4]


def test_sequence_numbers_within_a_batch(store):
    intake = ContributionIntake(store, AGGREGATOR, TASK)
    duplicate = receipt_wire(PEER, 2)
    result = intake.admit([receipt_wire(PEER, 9), duplicate, duplicate])
    assert [s.record.seq for s in result.accepted] == [2, 9]  # gaps are fine, arrival order does not matter
    assert [(r.position, r.reason) for r in result.rejected] == [(2, RejectReason.REPLAY)]
    twins = [receipt_wire(PEER, 10, samples=1), receipt_wire(PEER, 10, samples=2)]  # one seq signed twice
    result = intake.admit(twins)
    assert len(result.accepted) == 1
    assert [r.reason for r in result.rejected] == [RejectReason.OUT_OF_ORDER]


def test_timestamp_window_both_sides(store):
    clock = lambda: 1_800_000_000.0  # noqa: E731
    now = 1_800_000_000_000
    intake = ContributionIntake(store, AGGREGATOR, TASK, max_age_ms=60_000, max_ahead_ms=5_000, clock=clock)
    result = intake.admit(
        [
            receipt_wire(PEER, 1, timestamp=now - 60_000),  # oldest accepted
            receipt_wire(PEER, 2, timestamp=now + 5_000),  # furthest ahead accepted
            receipt_wire(PEER, 3, timestamp=now - 60_001),
            receipt_wire(PEER, 4, timestamp=now + 5_001),
        ]
    )
    assert [s.record.seq for s in result.accepted] == [1, 2]
    assert [(r.position, r.reason) for r in result.rejected] == [
        (2, RejectReason.STALE_TIMESTAMP),
        (3, RejectReason.STALE_TIMESTAMP),
    ]
    assert "old" in result.rejected[0].detail and "future" in result.rejected[1].detail


def test_identity_bindings(store):
    intake = ContributionIntake(store, AGGREGATOR, TASK, require_binding=True)
    intake.add_binding(binding_wire(PEER))
    intake.add_binding(binding_wire(OTHER, Libp2pKey.generate()))  # OTHER is bound to another peer id
    mine = peer_id_of(PEER)
    result = intake.admit(
        [
            Submission(receipt_wire(PEER, 1), sender_peer_id=mine),  # accepted
            Submission(
                receipt_wire(PEER, 2), sender_peer_id=fake_peer_id(b"mallory")
            ),  # relayed by someone else
            Submission(receipt_wire(OTHER, 1, peer_id=mine), sender_peer_id=mine),  # key not bound to mine
            Submission(
                receipt_wire(OTHER, 2), sender_peer_id=peer_id_of(OTHER)
            ),  # no binding for this peer id
        ]
    )
    assert [s.record.seq for s in result.accepted] == [1]
    assert [r.reason for r in result.rejected] == [RejectReason.UNBOUND_PEER] * 3
    with pytest.raises(RecordRejected):
        intake.add_binding(binding_wire(PEER).replace(b"/v2", b"/v3"))
    hijack = IdentityBinding.model_construct(  # OTHER binds its key to PEER's peer id, endorsed by its own
        peer_id=mine, public_key=OTHER.public_key_hex, timestamp=now_ms(),
        endorsement=Libp2pKey.generate().endorse(OTHER.public_key),
    )  # fmt: skip
    for sender in (peer_id_of(OTHER), mine, None):
        with pytest.raises(RecordRejected) as err:
            intake.add_binding(seal_unchecked(hijack, OTHER), sender_peer_id=sender)
        assert err.value.reason is RejectReason.UNBOUND_PEER
    assert intake.bindings[mine].public_key == PEER.public_key

    lenient = ContributionIntake(store, AGGREGATOR, TASK)  # no binding required: the sender must still match
    refused = lenient.screen([Submission(receipt_wire(OTHER, 5), sender_peer_id=mine)])
    assert [r.reason for r in refused.rejected] == [RejectReason.UNBOUND_PEER]


def test_extra_checks_plug_in_before_sequence_numbers(store):
    seen_before = []

    def no_big_batches(sealed, submission, ctx):
        seen_before.append(len(ctx.passed))
        if sealed.record.samples > 1000:
            raise RecordRejected(RejectReason.MALFORMED, "implausible sample count")
        assert ctx.task_id == TASK and ctx.store is store

    intake = ContributionIntake(store, AGGREGATOR, TASK, checks=[no_big_batches])
    result = intake.admit(
        [receipt_wire(OTHER, 1), receipt_wire(PEER, 1, samples=5000), receipt_wire(OTHER, 2)]
    )
    assert [r.detail for r in result.rejected] == ["implausible sample count"]
    assert seen_before == [0, 1, 1]  # a check sees the batch's receipts that passed before it
    # the refused receipt did not consume its sequence number
    assert intake.admit([receipt_wire(PEER, 1, samples=10)]).accepted


def test_a_failed_append_writes_nothing_and_counts_nothing(store):
    intake = ContributionIntake(store, PEER, TASK)  # not the log's key: the append is refused
    with pytest.raises(LedgerError):
        intake.admit([receipt_wire(PEER, 1), b"junk"])
    assert store.size == 0 and store.latest_checkpoint() is None
    assert sum(intake.counters.values()) == 0


def test_screen_writes_nothing(store):
    intake = ContributionIntake(store, AGGREGATOR, TASK)
    screening = intake.screen([receipt_wire(PEER, 1)])
    assert len(screening.accepted) == 1 and store.size == 0 and not intake.counters
