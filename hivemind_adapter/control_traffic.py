"""The coordination a process sends: its DHT requests and replies, and matchmaking's join messages.

A round moves two kinds of bytes: the tensors of its all-reduces (data, which grows with the model)
and everything that decides who meets whom and whether a result holds (control, which must not grow
with the swarm). This module counts the control part as it leaves the process: every DHT request
its node makes and every reply it serves (``rpc_ping``, ``rpc_store``, ``rpc_find``: the roster, the
progress and commit boards, matchmaking's declarations), every matchmaking join request or
reply its averagers send (``rpc_join_group``), and the commit certificates it relays (handlers named
``*.certificates.v1``). Counted are messages and their protobuf payload
bytes; libp2p's framing, encryption and TCP headers are not. Tensors (``rpc_aggregate_part``) and
state downloads are data and are not counted.

:func:`install_control_counting` wraps hivemind's protobuf calls and handlers for the whole process
(and the processes it forks); it must run before the DHT node and the averagers register their
handlers, as :func:`hivemind_adapter.dht.start_dht` does. :func:`control_traffic` reads the totals.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterable
from dataclasses import dataclass

CONTROL_METHODS = frozenset({"rpc_ping", "rpc_store", "rpc_find", "rpc_join_group"})
CONTROL_SUFFIXES = (".certificates.v1",)  # MANTA's own control handlers


@dataclass(frozen=True)
class ControlTraffic:
    """Control messages this process sent since it started, and their payload bytes."""

    messages: int = 0
    bytes: int = 0

    def __sub__(self, earlier: ControlTraffic) -> ControlTraffic:
        return ControlTraffic(self.messages - earlier.messages, self.bytes - earlier.bytes)


_lock = threading.Lock()  # guards _messages and _bytes: event loops of several threads count
_messages = 0
_bytes = 0
_installed = False


def control_traffic() -> ControlTraffic:
    """What this process has sent so far (zero before :func:`install_control_counting`)."""
    with _lock:
        return ControlTraffic(_messages, _bytes)


def is_control(handle_name: str) -> bool:
    """Whether a hivemind handler name (``[namespace::]Class.method``) is a control method."""
    return handle_name.rsplit(".", 1)[-1] in CONTROL_METHODS or handle_name.endswith(CONTROL_SUFFIXES)


def _count(message) -> None:
    global _messages, _bytes
    size = message.ByteSize()
    with _lock:
        _messages += 1
        _bytes += size


def install_control_counting() -> None:
    """Count control messages as this process sends them, from now on. Idempotent."""
    global _installed
    if _installed:
        return
    from hivemind.p2p import P2P

    add_handler = P2P.add_protobuf_handler

    async def add_protobuf_handler(self, name, handler, input_protobuf_type, **options):
        if is_control(name):
            handler = _counting_stream(handler) if options.get("stream_output") else _counting_unary(handler)
        return await add_handler(self, name, handler, input_protobuf_type, **options)

    P2P.call_protobuf_handler = _counting_call(P2P.call_protobuf_handler)  # replies in one message
    P2P.iterate_protobuf_handler = _counting_call(P2P.iterate_protobuf_handler)  # replies streamed
    P2P.add_protobuf_handler = add_protobuf_handler
    _installed = True


def _counting_call(call):
    """``call`` (a P2P method that sends one request to a peer's handler), counting the request."""

    async def counted(self, peer_id, name, input, output_protobuf_type):
        if is_control(name) and not isinstance(input, AsyncIterable):
            _count(input)
        return await call(self, peer_id, name, input, output_protobuf_type)

    return counted


def _counting_unary(handler):
    async def counted(request, context):
        reply = await handler(request, context)
        _count(reply)
        return reply

    return counted


def _counting_stream(handler):
    async def counted(request, context):
        output = handler(request, context)
        if isinstance(output, AsyncIterable):
            async for reply in output:
                _count(reply)
                yield reply
        else:
            reply = await output
            _count(reply)
            yield reply

    return counted
