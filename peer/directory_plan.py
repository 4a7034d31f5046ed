"""A round's plan from the cohort directory that governs its attempt (:mod:`peer.directory_view`).

Where an aggregator publishes the directory (a task whose rounds certificates decide), every peer of
an attempt takes the same cohorts, ranks and roster from it, instead of from its own read of the
members' announcements: two peers whose reads differed counted against different rosters (seen: a
newcomer whose roster of 10 refused the votes of 70 peers outside it, and stayed undecided for
209 s). The directory is read whole once per epoch, from its aggregator, off the DHT.

A peer that no cohort of the governing directory lists (a newcomer, or one the aggregator has not
seen yet) takes no part: it waits until an epoch lists it (:class:`NotListedYet`).
"""

from __future__ import annotations

import logging

from peer.directory_view import DirectoryUnavailable, DirectoryView, WholeDirectory
from peer.round_types import RoundPlan

logger = logging.getLogger(__name__)


class NotListedYet(Exception):
    """This peer is in no cohort of the directory that governs the attempt; the message says which."""

    def __init__(self, epoch: int, attempt: int):
        super().__init__(
            f"this peer is in no cohort of directory epoch {epoch}, which governs attempt {attempt}: "
            "it takes part from an epoch that lists it"
        )
        self.epoch, self.attempt = epoch, attempt


def governing_directory(view: DirectoryView | None, attempt: int) -> WholeDirectory | None:
    """The whole directory that governs ``attempt``, or None where there is none to plan from (no
    view, no directory yet, its aggregator gone, or its pages did not come: the round then plans
    from this peer's roster, as a swarm without a directory does)."""
    if view is None:
        return None
    try:
        return view.whole(attempt)
    except DirectoryUnavailable as e:
        logger.warning(f"attempt {attempt}: planned from the roster read here: {e}")
        return None


def plan_from_directory(whole: WholeDirectory, peer_id: str, round_index: int, attempt: int) -> RoundPlan:
    """``peer_id``'s plan of round ``round_index`` in ``attempt``: its cohort's page, the page's rank
    among the directory's, and every member as the roster. NotListedYet if no page lists it."""
    rank = whole.rank_of(peer_id)
    if rank is None:
        raise NotListedYet(whole.header.epoch, attempt)
    cohorts = tuple(tuple(m.peer_id for m in page.members) for page in whole.pages)
    return RoundPlan(
        round_index,
        attempt,
        whole.pages[rank].cohort,
        rank,
        len(cohorts),
        len(cohorts[rank]),
        tuple(peer for members in cohorts for peer in members),
        cohorts,
    )
