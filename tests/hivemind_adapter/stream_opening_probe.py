"""Opens and closes a connection to a p2p client's stream socket, as the daemon does for a stream
reset at once, and prints how many "Unhandled exception" errors asyncio logged (run by
test_stream_openings.py: ``python -m tests.hivemind_adapter.stream_opening_probe quiet|plain``)."""

from __future__ import annotations

import asyncio
import logging
import sys

from hivemind_adapter.runtime import prepare_process

prepare_process()

from hivemind.p2p import P2P  # noqa: E402

from hivemind_adapter.stream_openings import install_quiet_stream_openings  # noqa: E402


class Count(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.errors = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.errors += "Unhandled exception" in record.getMessage()


async def _serve(_info, _reader, writer) -> None:
    writer.close()


async def main(quiet: bool) -> None:
    if quiet:
        install_quiet_stream_openings()
    counter = Count()
    logging.getLogger("asyncio").addHandler(counter)
    p2p = await P2P.create(host_maddrs=["/ip4/127.0.0.1/tcp/0"])
    try:
        await p2p.add_binary_stream_handler("probe", _serve)  # the client listens for streams from now on
        path = p2p._client.control.listen_maddr.value_for_protocol("unix")
        for _ in range(3):
            _reader, writer = await asyncio.open_unix_connection(path)
            writer.close()
            await writer.wait_closed()
        await asyncio.sleep(1.0)
    finally:
        await p2p.shutdown()
    print(counter.errors, flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] == "quiet"))
