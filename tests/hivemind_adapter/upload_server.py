"""A node that serves a blob, with or without an upload cap (run as a process of its own by
test_upload_limit.py): ``python -m tests.hivemind_adapter.upload_server RATE_BYTES_PER_S|none``.
Prints its multiaddr, then serves until its stdin closes."""

from __future__ import annotations

import sys

from hivemind_adapter.runtime import prepare_process

prepare_process()

from hivemind_adapter.dht import start_dht, visible_maddrs  # noqa: E402
from hivemind_adapter.p2p import Endpoint  # noqa: E402
from hivemind_adapter.upload_limit import limit_upload  # noqa: E402

BLOB = bytes(range(256)) * 4096  # 1 MiB


async def _serve_blob(payload: bytes, sender: str) -> bytes:
    return BLOB


def main() -> None:
    if sys.argv[1] != "none":
        limit_upload(float(sys.argv[1]))
    dht = start_dht(host_maddrs=["/ip4/127.0.0.1/tcp/0"])
    endpoint = Endpoint(dht, "upload-server")
    endpoint.serve("blob", _serve_blob)
    print(visible_maddrs(dht)[0], flush=True)
    try:
        sys.stdin.read()  # until the test closes it
    finally:
        endpoint.close()
        dht.shutdown()


if __name__ == "__main__":
    main()
