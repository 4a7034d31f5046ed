"""A stream the libp2p daemon opens to this process and closes before it says which handler it is for
costs nothing, not an ERROR with a traceback in the peer's log.

When another node opens a stream to one of this node's handlers, the daemon connects to the client's
listening socket and first writes the stream's header. A stream the remote end reset at once arrives
as a connection that closes before its header; hivemind's client lets the read fail inside asyncio's
connection callback, which asyncio logs as "Unhandled exception in client_connected_cb" with a full
traceback. :func:`install_quiet_stream_openings` serves such a connection by closing it. Likewise a
stream whose handler is cancelled as the event loop shuts down (a known group's early parts, held
for a group this peer will not join as it leaves) closes instead of logging a CancelledError.
"""

from __future__ import annotations

import asyncio
import logging

logger = logging.getLogger(__name__)

_installed = False


def install_quiet_stream_openings() -> None:
    """Make every hivemind p2p client of this process (and of the processes it forks) close a stream
    that ends before its header instead of raising. Idempotent."""
    global _installed
    if _installed:
        return
    from hivemind.p2p.p2p_daemon_bindings.control import ControlClient, DispatchFailure
    from hivemind.p2p.p2p_daemon_bindings.datastructures import StreamInfo
    from hivemind.p2p.p2p_daemon_bindings.utils import read_pbmsg_safe
    from hivemind.proto import p2pd_pb2

    async def serve_stream(self: ControlClient, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        header = p2pd_pb2.StreamInfo()
        try:
            await read_pbmsg_safe(reader, header)
        except asyncio.IncompleteReadError:
            logger.debug("a stream closed before its header: nothing to serve")
            writer.close()
            return
        stream = StreamInfo.from_protobuf(header)
        handler = self.handlers.get(stream.proto)
        if handler is None:  # the daemon rejects streams for unknown protocols before this
            writer.close()
            raise DispatchFailure(f"no handler for {stream.proto}")
        try:
            await handler(stream, reader, writer)
        except asyncio.CancelledError:  # nobody awaits a connection's task: it ends here, quietly
            logger.debug(f"a {stream.proto} stream was cancelled: the event loop is shutting down")
            writer.close()

    ControlClient._handler = serve_stream
    _installed = True
