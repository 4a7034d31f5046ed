"""A group's smallest size, and the quorum its members must bring, as hivemind's leader decides it.

When a leader's matchmaking wait ends with a group that is not full, hivemind starts the all-reduce
if ``len(followers) + 1 >= min_group_size``, and otherwise releases its followers, who go on
looking. :class:`QuorumGate` stands in for ``min_group_size`` in that comparison: the group also
starts only if the peers its members' gathered metadata lists hold a strict majority of the given
members. A group of units that count enough by roster but bring too few contributors then waits
for the rest (a result it formed without them could not commit, and would split the quorum).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from hivemind.utils import MSGPackSerializer

logger = logging.getLogger(__name__)


def listed_peers(data_for_gather: bytes) -> set[str]:
    """The peer ids a member's gathered metadata brings, as hivemind's ``step`` wraps it
    (``[bandwidth, mode, serialized gather]``): a gather that is one peer's record (a mapping with
    ``"peer"``), or lists several under ``"members"``; empty for metadata in any other form."""
    try:
        _, _, user_data = MSGPackSerializer.loads(data_for_gather)
        gather = MSGPackSerializer.loads(user_data)
        records = gather["members"] if "members" in gather else [gather]
        return {str(record["peer"]) for record in records}
    except Exception:  # a malformed or foreign record brings nobody
        return set()


class QuorumGate:
    """``min_group_size`` for a matchmaking whose groups must hold a quorum of ``members``:
    ``size <= gate`` (hivemind asks ``size >= min_group_size``) holds when ``size >= least`` and the
    members the group's gathered metadata lists are more than half of ``members``."""

    def __init__(self, matchmaking, least: int, members: Iterable[str]):
        self.matchmaking, self.least, self.members = matchmaking, int(least), frozenset(members)

    def holds_quorum(self) -> bool:
        """Whether the group the leader holds now (itself and its followers) brings a quorum."""
        mm = self.matchmaking
        blobs = [mm.step_control.data_for_gather] if mm.step_control is not None else []
        blobs += [request.gather for request in mm.current_followers.values()]
        peers = set().union(*map(listed_peers, blobs)) if blobs else set()
        holds = 2 * len(peers & self.members) > len(self.members)
        if not holds:
            logger.debug(
                f"a group of {len(blobs)} brings {len(peers & self.members)} of {len(self.members)}: not begun"
            )
        return holds

    def __le__(self, size: int) -> bool:
        return size >= self.least and self.holds_quorum()

    def __repr__(self) -> str:
        return f"QuorumGate(least={self.least}, members={len(self.members)})"
