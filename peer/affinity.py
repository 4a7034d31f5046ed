"""Node affinity: who should average with whom first.

A cohort is the explicit ``--cohort`` name if given; otherwise peers on the same host form a cohort,
and peers alone on their host group by network (the /24 of the address they announce, or of the
address they reach the swarm from). A cohort larger than the task's maximum is split into near-equal
parts by sorted peer id. Every peer computes the assignment from the same DHT roster with no further
messages, so all members agree on their cohort (a peer seeing a slightly different roster only costs
a round retry, never a wrong average: see :mod:`peer.hierarchy`).
"""

from __future__ import annotations

import hashlib
import ipaddress
import math
import socket
from dataclasses import dataclass


def host_id() -> str:
    """A stable, anonymous id of this machine (hash of its machine id, else its hostname)."""
    for path in ("/etc/machine-id", "/var/lib/dbus/machine-id"):
        try:
            with open(path) as f:
                raw = f.read().strip()
            if raw:
                return hashlib.sha256(b"manta-host:" + raw.encode()).hexdigest()[:16]
        except OSError:
            continue
    return hashlib.sha256(b"manta-host:" + socket.gethostname().encode()).hexdigest()[:16]


def network_id(address: str | None) -> str:
    """The hashed /24 (IPv4) or /48 (IPv6) of ``address``; an unknown address gets its own network."""
    try:
        ip = ipaddress.ip_address(address or "")
        prefix = 24 if ip.version == 4 else 48
        net = ipaddress.ip_network(f"{ip}/{prefix}", strict=False)
        return hashlib.sha256(b"manta-net:" + str(net).encode()).hexdigest()[:8]
    except ValueError:
        return hashlib.sha256(b"manta-net:unknown:" + host_id().encode()).hexdigest()[:8]


@dataclass(frozen=True)
class RosterEntry:
    peer_id: str
    host_id: str
    network_id: str
    explicit_cohort: str | None  # the peer's --cohort, or None for automatic


def assign_cohorts(roster: list[RosterEntry], max_size: int) -> dict[str, str]:
    """peer id -> cohort name, identical on every peer that sees the same roster."""
    groups: dict[str, list[str]] = {}
    by_host: dict[str, list[RosterEntry]] = {}
    for entry in roster:
        if entry.explicit_cohort:
            groups.setdefault(entry.explicit_cohort, []).append(entry.peer_id)
        else:
            by_host.setdefault(entry.host_id, []).append(entry)
    for host, entries in by_host.items():
        if len(entries) > 1:
            groups.setdefault(f"host-{host[:8]}", []).extend(e.peer_id for e in entries)
        else:
            groups.setdefault(f"net-{entries[0].network_id}", []).append(entries[0].peer_id)
    assignment: dict[str, str] = {}
    for name, members in groups.items():
        members = sorted(set(members))
        parts = max(1, math.ceil(len(members) / max(1, max_size)))
        for i, peer in enumerate(members):
            # Near-equal contiguous parts of the sorted list (sizes differ by at most one).
            part = i * parts // len(members)
            assignment[peer] = name if parts == 1 else f"{name}.{part}"
    return assignment


def cohort_sizes(assignment: dict[str, str]) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for cohort in assignment.values():
        sizes[cohort] = sizes.get(cohort, 0) + 1
    return sizes
