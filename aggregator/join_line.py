"""The line a volunteer pastes to join: ``manta-peer join`` with every address and the signer's key."""

from __future__ import annotations

import ipaddress
import shlex
from collections.abc import Sequence

MULTIADDRS_FILE = "multiaddrs.txt"  # in the data dir: where this aggregator's DHT node listens


def _reach_rank(maddr: str) -> int:
    """0 for an address other hosts can dial (public or private), 1 for link-local, 2 for loopback."""
    parts = maddr.split("/")
    if len(parts) < 3 or parts[1] not in ("ip4", "ip6"):
        return 0  # a DNS name: the operator announced it for others to use
    try:
        ip = ipaddress.ip_address(parts[2])
    except ValueError:
        return 0
    if ip.is_loopback:
        return 2
    return 1 if ip.is_link_local else 0


def join_command(task_id: str, maddrs: Sequence[str], aggregator_key_hex: str) -> str:
    """A shell line that runs as printed: one ``--initial-peers`` per address (other hosts' first,
    loopback last, duplicates dropped) and ``--aggregator-key``, so the peer trusts this spec only.

    Raises ValueError when there is no address to give.
    """
    unique = list(dict.fromkeys(m.strip() for m in maddrs if m.strip()))
    if not unique:
        raise ValueError("the aggregator has no address to give volunteers")
    ordered = sorted(unique, key=_reach_rank)  # stable: the node's own order within a rank
    argv = ["manta-peer", "join", "--task", task_id, "--aggregator-key", aggregator_key_hex]
    for maddr in ordered:
        argv += ["--initial-peers", maddr]
    return shlex.join(argv)
