"""A store's search for the nodes nearest its key asks for nodes only, not for the key's value.

hivemind's ``store`` first finds the ``num_replicas`` nodes nearest the key with the same
``rpc_find`` that reads use, and each node it asks replies with the key's whole value (the roster,
a board: one entry per peer), which the storing node validates entry by entry and throws away. So
each refresh of a peer's announcement downloaded the whole roster from every node its search asked.

After :func:`install_nodes_only_store_search`, this process's nodes answer a find request that ends
with :data:`NODES_ONLY` (a key id that no key hashes to) with each key's nearest nodes and no value,
and the marker with nothing; and, while the process asks for nodes only (the default; see
:func:`ask_for_nodes_only`), its searches for nodes (a store's, a bootstrap's, a bucket refresh's) add
the marker. A node without this answers as usual (and NOT_FOUND for the marker), so a swarm with
older nodes still works. Reads (``get``) are unchanged.
"""

from __future__ import annotations

import asyncio
import contextvars

NODES_ONLY = bytes(20)  # a DHTID of 0: a key's id is a SHA-1 digest, never 20 zero bytes

_searching_nodes: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "manta_searching_nodes", default=False
)
_installed = False
_asking = True  # whether this process's searches for nodes add the marker


def ask_for_nodes_only(asking: bool) -> None:
    """Whether this process's searches for nodes ask for nodes only (True) or, as hivemind's do, for
    values too (False: only to measure the difference, ``benchmarks/swarm_scale.py``)."""
    global _asking
    _asking = asking


def install_nodes_only_store_search() -> None:
    """From now on, in this process: searches for nodes ask for nodes only, and this process's DHT
    nodes answer such requests without values. Idempotent; before any DHT node starts."""
    global _installed
    if _installed:
        return
    from hivemind.dht.node import DHTNode
    from hivemind.dht.protocol import DHTProtocol
    from hivemind.dht.routing import DHTID
    from hivemind.proto import dht_pb2

    DHTProtocol._collect_rpc_handlers()  # the handlers' message types, read from hivemind's own rpc_find
    find_nearest_nodes, call_find, rpc_find = (
        DHTNode.find_nearest_nodes,
        DHTProtocol.call_find,
        DHTProtocol.rpc_find,
    )
    marker = DHTID.from_bytes(NODES_ONLY)

    async def searching_nodes(self, *args, **kwargs):
        searching = _searching_nodes.set(True)  # the tasks its traversal starts copy the flag
        try:
            return await find_nearest_nodes(self, *args, **kwargs)
        finally:
            _searching_nodes.reset(searching)

    async def call_find_nodes_only(self, peer, keys):
        if not (_asking and _searching_nodes.get()):
            return await call_find(self, peer, keys)
        found = await call_find(self, peer, [*keys, marker])
        if found is not None:
            found.pop(marker, None)
        return found

    async def rpc_find_nodes_only(self, request, context):
        if not request.keys or request.keys[-1] != NODES_ONLY:
            return await rpc_find(self, request, context)
        if request.peer:  # as hivemind's: a caller that says who it is joins the routing table
            asyncio.create_task(self.rpc_ping(dht_pb2.PingRequest(peer=request.peer), context))
        caller = DHTID.from_bytes(request.peer.node_id)
        response = dht_pb2.FindResponse(results=[], peer=self.node_info)
        for key in request.keys:
            result = dht_pb2.FindResult(type=dht_pb2.NOT_FOUND)
            if key != NODES_ONLY:
                nearest = self.routing_table.get_nearest_neighbors(
                    DHTID.from_bytes(key), k=self.bucket_size, exclude=caller
                )
                for node_id, peer_id in nearest:
                    result.nearest_node_ids.append(node_id.to_bytes())
                    result.nearest_peer_ids.append(peer_id.to_bytes())
            response.results.append(result)
        return response

    DHTNode.find_nearest_nodes = searching_nodes
    DHTProtocol.call_find = call_find_nodes_only
    DHTProtocol.rpc_find = rpc_find_nodes_only
    _installed = True
