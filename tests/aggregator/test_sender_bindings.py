"""The desk learns which key speaks for a peer id from that peer alone: the binding arrives with the
receipt over the stream that authenticated the sender, never from the DHT (where anyone could claim
a victim's peer id and cut it off from credit)."""

from __future__ import annotations

from aggregator.contributions import ContributionDesk
from hivemind_adapter.p2p import Endpoint
from protocol.identity import Identity
from protocol.peer_keys import Libp2pKey
from protocol.receipt_delivery import ReceiptDelivery
from protocol.records import IdentityBinding
from tests.helpers import two_task_dhts
from tests.protocol.factories import (
    TASK,
    binding_wire,
    now_ms,
    peer_id_of,
    receipt_wire,
    seal_unchecked,
    task_spec,
)


def test_the_desk_takes_a_binding_from_its_sender_only(tmp_path):
    aggregator, honest, mallory = Identity.generate(), Identity.generate(), Identity.generate()
    me, hers = peer_id_of(honest), peer_id_of(mallory)
    with two_task_dhts(TASK) as (desk_dht, _):
        endpoint = Endpoint(desk_dht, "desk")
        desk = ContributionDesk(desk_dht, endpoint, aggregator, task_spec(aggregator), tmp_path / "l.sqlite")
        try:
            # a receipt whose sender never handed over its binding: unbound
            reply = desk.submit(receipt_wire(honest, 1), me)
            assert (reply["status"], reply["reason"]) == ("rejected", "unbound_peer"), reply
            # the honest binding, copied and handed over from Mallory's peer id: refused, nothing settled
            copied = ReceiptDelivery(receipt_wire(honest, 2), binding_wire(honest)).to_bytes()
            reply = desk.submit(copied, hers)
            assert reply["status"] == "rejected" and "came from" in reply["detail"], reply
            # Mallory's key bound to the honest peer id, endorsed by a libp2p key of her own
            hijack = IdentityBinding.model_construct(
                peer_id=me, public_key=mallory.public_key_hex, timestamp=now_ms(),
                endorsement=Libp2pKey.generate().endorse(mallory.public_key),
            )  # fmt: skip
            forged = ReceiptDelivery(receipt_wire(mallory, 1, peer_id=me), seal_unchecked(hijack, mallory))
            for sender in (me, hers):
                reply = desk.submit(forged.to_bytes(), sender)
                assert (reply["status"], reply["reason"]) == ("rejected", "unbound_peer"), reply
            # the honest peer's own delivery of the receipt Mallory relayed: taken
            reply = desk.submit(copied, me)
            assert reply["status"] == "queued", reply
            reply = desk.submit(b"one\n\ntwo\n\nthree", me)
            assert (reply["status"], reply["reason"]) == ("rejected", "malformed"), reply
        finally:
            desk.shutdown()
            endpoint.close()
