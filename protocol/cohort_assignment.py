"""Which cohort each member is in, from the roster alone (the rule :mod:`peer.affinity` explains):
an explicit ``--cohort`` name, else the peers of one host, else the peers of one network; a cohort
larger than the task's maximum split into near-equal parts by sorted peer id. Every reader of one
roster gets one assignment (peers from their roster reads, an aggregator for its cohort directory).

Pure Python.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from protocol.cohort_directory import DirectoryMember
from protocol.records import PeerAnnouncement


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


def directory_cohorts(
    announcements: Iterable[PeerAnnouncement], withdrawn: frozenset[str], max_size: int
) -> dict[str, list[DirectoryMember]]:
    """The cohorts of the members ``announcements`` show offering work, as a cohort directory lists
    them: the peers' own roster rule (not withdrawn, announcing throughput, and a peer id that two
    keys claim left out: only its libp2p key's holder can endorse both), cohorts by
    :func:`assign_cohorts`."""
    latest: dict[str, PeerAnnouncement] = {}
    for a in announcements:
        if a.public_key not in latest or a.timestamp > latest[a.public_key].timestamp:
            latest[a.public_key] = a
    keys: dict[str, set[str]] = {}
    offering: dict[str, PeerAnnouncement] = {}
    for a in latest.values():
        keys.setdefault(a.peer_id, set()).add(a.public_key)
        if a.throughput_milli > 0 and a.public_key not in withdrawn:
            offering[a.peer_id] = a
    members = {peer: a for peer, a in offering.items() if len(keys[peer]) == 1}
    entries = [
        RosterEntry(
            peer,
            a.affinity.host_id,
            a.affinity.network_id,
            None if a.cohort_id.startswith("auto") else a.cohort_id,
        )
        for peer, a in sorted(members.items())
    ]
    cohorts: dict[str, list[DirectoryMember]] = {}
    for peer, cohort in assign_cohorts(entries, max_size).items():
        cohorts.setdefault(cohort, []).append(DirectoryMember(peer, members[peer].public_key))
    return cohorts
