"""The contribution desk's face on the network: the handlers it serves on its endpoint
(``manta/<task>/submit``, ``status``, ``credits``, ``witnesses``, ``state-handoff``) and what it publishes in the DHT,
its identity binding under ``manta_<task>_aggregators`` and its checkpoint notes under
``manta_<task>_ledger`` (each under the aggregator's public key, for an hour)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass

from hivemind_adapter.dht import peer_id, read_entries, speaker, store
from hivemind_adapter.p2p import Endpoint
from protocol.dht_schema import aggregators_key, ledger_key, open_ledger_value, withdrawals_key
from protocol.handler_names import (
    credits_handler,
    state_handoff_handler,
    status_handler,
    submit_handler,
    witnesses_handler,
)
from protocol.identity import Identity
from protocol.ledger_checkpoint import Checkpoint
from protocol.membership import MembershipWithdrawal
from protocol.record_lifetimes import PUBLISHED_TTL
from protocol.records import IdentityBinding
from protocol.sealing import RecordRejected, Sealed, seal

Handler = Callable[[bytes, str], dict]  # (payload, sender's peer id) -> the JSON reply


@dataclass(frozen=True)
class DeskHandlers:
    """What answers each of the desk's calls."""

    submit: Handler
    status: Handler
    credits: Handler
    witnesses: Handler
    state_handoff: Handler


def handler_names(task_id: str) -> tuple[str, ...]:
    """The desk's calls, in :class:`DeskHandlers`' order."""
    return (
        submit_handler(task_id),
        status_handler(task_id),
        credits_handler(task_id),
        witnesses_handler(task_id),
        state_handoff_handler(task_id),
    )


def _named(task_id: str, handlers: DeskHandlers) -> list[tuple[str, Handler]]:
    h = handlers
    return list(zip(handler_names(task_id), (h.submit, h.status, h.credits, h.witnesses, h.state_handoff)))


def json_call(fn: Handler):
    """``fn`` as an endpoint handler: run in a thread, its dict sent as JSON (an error as one)."""

    async def handle(payload: bytes, sender: str) -> bytes:
        # The handlers wait for the ledger writer: run them off the event loop, so one slow append
        # never stalls every other call this endpoint answers.
        try:
            reply = await asyncio.to_thread(fn, payload, sender)
        except Exception as e:  # a bad request must never take the handler down
            reply = {"status": "error", "detail": f"{type(e).__name__}: {e}"}
        return json.dumps(reply).encode()

    return handle


def serve(endpoint: Endpoint, task_id: str, handlers: DeskHandlers) -> None:
    """Serve ``handlers`` on ``endpoint``, each in a thread; a handler that raises answers
    ``{"status": "error", "detail": ...}``; every reply is sent as JSON."""
    for name, fn in _named(task_id, handlers):
        endpoint.serve(name, json_call(fn))


def unserve(endpoint: Endpoint, task_id: str) -> None:
    """Stop serving the desk's calls of ``task_id`` on ``endpoint``."""
    for name in handler_names(task_id):
        endpoint.unserve(name)


def publish_binding(dht, identity: Identity, task_id: str) -> None:
    """Publish the binding of this DHT node's peer id to ``identity``'s key, which the two keys sign."""
    binding = IdentityBinding(
        peer_id=peer_id(dht),
        public_key=identity.public_key_hex,
        endorsement=speaker(dht, identity).endorsement,
        timestamp=int(time.time() * 1000),
    )
    store(
        dht,
        aggregators_key(task_id),
        seal(binding, identity),
        ttl=PUBLISHED_TTL,
        subkey=identity.public_key_hex,
    )


def publish_checkpoint(dht, identity: Identity, task_id: str, note: str) -> None:
    """Publish a checkpoint ``note`` of the ledger, replacing the one published before."""
    store(dht, ledger_key(task_id), note.encode(), ttl=PUBLISHED_TTL, subkey=identity.public_key_hex)


def published_head(dht, identity: Identity, task_id: str) -> Checkpoint | None:
    """The checkpoint ``identity`` last published for ``task_id`` that the DHT still holds (one bounded
    read), checked against its key; None if there is none."""
    value = read_entries(dht, ledger_key(task_id)).get(identity.public_key_hex)
    if value is None:
        return None
    try:
        return open_ledger_value(identity.public_key_hex, value)
    except RecordRejected:
        return None


def publish_withdrawal(dht, withdrawal: Sealed[MembershipWithdrawal]) -> None:
    """Publish a key's withdrawn membership until its last certificate expires."""
    record = withdrawal.record
    ttl = max(60.0, record.until_ms / 1000 - time.time())
    store(dht, withdrawals_key(record.task_id), withdrawal.wire, ttl=ttl, subkey=record.member_key)
