"""A peer's membership on real DHT nodes: it asks the aggregator for a certificate and keeps it, a
refusal is one line, and keys nobody admitted count in no roster (40 throw-away keys around two
members: the roster holds the two)."""

from __future__ import annotations

import pytest

from aggregator.admission import AdmissionDesk, serve_admission
from aggregator.desk_network import publish_binding
from aggregator.membership_policy import MembershipPolicy
from hivemind_adapter.dht import read_entries, speaker, store
from hivemind_adapter.p2p import Endpoint
from peer.membership import Membership, NotAdmitted, sealed_binding
from peer.receipts import AggregatorLink
from peer.roster_view import read_roster
from protocol.dht_schema import peers_key
from protocol.identity import Identity
from protocol.membership import MembershipCertificate
from protocol.peer_keys import Libp2pKey, Speaker
from protocol.record_lifetimes import ANNOUNCE_TTL
from protocol.records import Affinity, DeviceInfo, PeerAnnouncement
from protocol.sealing import open_sealed, seal
from tests.helpers import announced_member, two_task_dhts, wait_until
from tests.protocol.factories import TASK, certificate_wire, now_ms, task_spec

DEVICES = (DeviceInfo(kind="cpu", name="test cpu", memory_mb=1024),)
AFFINITY = Affinity(host_id="ab" * 8, network_id="cd" * 8)


def _serving_aggregator(dht, aggregator: Identity, policy: MembershipPolicy, folder):
    endpoint = Endpoint(dht, "aggregator")
    serve_admission(endpoint, TASK, AdmissionDesk(aggregator, TASK, policy, folder / "members.jsonl"))
    publish_binding(dht, aggregator, TASK)  # where peers find it
    return endpoint


def test_a_peer_asks_for_its_certificate_keeps_it_and_needs_no_aggregator_while_it_lives(tmp_path):
    aggregator, identity = Identity.generate(), Identity.generate()
    keys = (aggregator.public_key_hex,)
    with two_task_dhts(TASK) as (desk_dht, peer_dht):
        desk_end = _serving_aggregator(desk_dht, aggregator, MembershipPolicy(), tmp_path)
        peer_end = Endpoint(peer_dht, "peer")
        try:
            link = AggregatorLink(peer_dht, peer_end, TASK, keys)
            me = speaker(peer_dht, identity)
            membership = Membership(link, TASK, keys, me, tmp_path / "membership.sealed")
            membership.obtain(seconds=30)
            certificate = open_sealed(membership.wire(), MembershipCertificate).record
            assert (certificate.member_key, certificate.peer_id) == (identity.public_key_hex, me.peer_id)
            desk_end.close()  # the aggregator goes down: the kept certificate still serves a restart
            again = Membership(link, TASK, keys, me, tmp_path / "membership.sealed")
            again.obtain(seconds=0)
            assert again.wire() == membership.wire()
            stranger = Membership(link, TASK, keys, speaker(peer_dht, Identity.generate()), tmp_path / "x")
            with pytest.raises(NotAdmitted, match="no aggregator of the task answered"):
                stranger.obtain(seconds=1)
        finally:
            peer_end.close()
            desk_end.close()


def test_a_key_the_policy_does_not_admit_gets_one_line(tmp_path):
    aggregator, identity = Identity.generate(), Identity.generate()
    policy = MembershipPolicy(mode="allow", allow=frozenset({Identity.generate().public_key_hex}))
    with two_task_dhts(TASK) as (desk_dht, peer_dht):
        desk_end = _serving_aggregator(desk_dht, aggregator, policy, tmp_path)
        peer_end = Endpoint(peer_dht, "peer")
        try:
            link = AggregatorLink(peer_dht, peer_end, TASK, (aggregator.public_key_hex,))
            membership = Membership(
                link, TASK, (aggregator.public_key_hex,), speaker(peer_dht, identity), tmp_path / "m.sealed"
            )
            with pytest.raises(NotAdmitted) as refused:
                membership.obtain(seconds=30)
            assert "did not admit this peer: this task admits listed keys only" in str(refused.value)
            assert "\n" not in str(refused.value) and not (tmp_path / "m.sealed").exists()
        finally:
            peer_end.close()
            desk_end.close()


def _sybil_entry(identity: Identity, self_signed: bool) -> list[bytes]:
    """A throw-away key's announcement under a throw-away libp2p key, bound properly, with a
    certificate it signed itself (or none)."""
    who = Speaker.of(identity, Libp2pKey.generate())
    record = PeerAnnouncement(
        task_id=TASK, peer_id=who.peer_id, public_key=identity.public_key_hex, devices=DEVICES,
        throughput_milli=100_000, affinity=AFFINITY, cohort_id="auto", timestamp=now_ms(),
    )  # fmt: skip
    entry = [seal(record, identity), sealed_binding(who)]
    if self_signed:
        entry.append(certificate_wire(identity, aggregator=identity, peer_id=who.peer_id))
    return entry


def test_throw_away_keys_without_admission_count_in_no_roster(tmp_path):
    aggregator = Identity.generate()
    spec = task_spec(aggregator)
    with two_task_dhts(TASK) as (first, second):
        members = [announced_member(dht, aggregator, TASK).peer_id for dht in (first, second)]
        for i in range(40):  # the Sybil: 40 keys, half with certificates of their own making
            sybil = Identity.generate()
            store(
                second,
                peers_key(TASK),
                _sybil_entry(sybil, i % 2 == 0),
                ANNOUNCE_TTL,
                subkey=sybil.public_key_hex,
            )
        # stored (nodes that do not know the aggregators keep self-signed entries): 2 + 20 entries
        wait_until(lambda: len(read_entries(first, peers_key(TASK))) >= 22, 15, "the entries to be read")
        assert sorted(p.entry.peer_id for p in read_roster(first, spec)) == sorted(members)
        assert sorted(p.entry.peer_id for p in read_roster(second, spec)) == sorted(members)
