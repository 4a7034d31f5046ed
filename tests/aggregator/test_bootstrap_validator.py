"""The aggregator's own DHT node checks membership certificates against the task's aggregator keys,
as every peer's does: an announcement with a certificate its key signed itself is refused there
(the store fails) and not read through it. A real bootstrap aggregator and a real second node on 127.0.0.1."""

from __future__ import annotations

from aggregator.bootstrap import BootstrapAggregator, BootstrapConfig
from hivemind_adapter.dht import read_entries, start_dht, store
from protocol.dht_schema import peers_key
from protocol.identity import Identity
from protocol.peer_keys import Libp2pKey, Speaker
from protocol.record_lifetimes import ANNOUNCE_TTL
from protocol.records import Affinity, DeviceInfo, PeerAnnouncement
from protocol.sealing import seal
from tests.helpers import wait_until
from tests.protocol.factories import TASK, certificate_wire, now_ms, speaker_binding_wire, task_spec

DEVICES = (DeviceInfo(kind="cpu", name="test cpu", memory_mb=1024),)
AFFINITY = Affinity(host_id="ab" * 8, network_id="cd" * 8)


def _entry(identity: Identity, certifier: Identity) -> list[bytes]:
    """``identity``'s announcement under a fresh libp2p key, with a certificate ``certifier`` signed."""
    who = Speaker.of(identity, Libp2pKey.generate())
    record = PeerAnnouncement(
        task_id=TASK, peer_id=who.peer_id, public_key=identity.public_key_hex, devices=DEVICES,
        throughput_milli=100_000, affinity=AFFINITY, cohort_id="auto", timestamp=now_ms(),
    )  # fmt: skip
    certificate = certificate_wire(identity, aggregator=certifier, peer_id=who.peer_id)
    return [seal(record, identity), speaker_binding_wire(who), certificate]


def test_the_aggregators_node_keeps_no_self_certified_announcement(tmp_path):
    aggregator, member, sybil = Identity.generate(), Identity.generate(), Identity.generate()
    config = BootstrapConfig(
        listen="127.0.0.1:0", data_dir=tmp_path / "agg", checkpoint_seconds=0, receipts=False
    )
    node = BootstrapAggregator(task_spec(aggregator), aggregator, config)
    maddrs = node.start()
    plain = start_dht(host_maddrs=["/ip4/127.0.0.1/tcp/0"], initial_peers=maddrs)  # checks nothing
    try:
        assert not store(
            plain, peers_key(TASK), _entry(sybil, sybil), ANNOUNCE_TTL, subkey=sybil.public_key_hex
        )
        assert store(
            plain, peers_key(TASK), _entry(member, aggregator), ANNOUNCE_TTL, subkey=member.public_key_hex
        )
        wait_until(lambda: member.public_key_hex in read_entries(node.dht, peers_key(TASK)), 15, "the member")
        assert set(read_entries(node.dht, peers_key(TASK))) == {member.public_key_hex}
    finally:
        plain.shutdown()
        node.shutdown()
