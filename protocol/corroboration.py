"""Figures from peers' signed records that one peer alone cannot push: the highest *corroborated* value.

A progress record is signed, so it is its peer's claim, but the claim is free: a peer that publishes
round 10^9 would otherwise make every honest peer believe it has fallen behind (and stop computing to
catch up with nobody) and make the aggregator refuse every honest receipt as far behind the swarm.
The highest value that at least two peers report cannot be set by one of them; with a single
reporter there is nobody to corroborate, and its value stands (a swarm of two cannot outvote a liar).
An honest peer that is one round ahead alone is seen a moment later, when a second peer gets there.
"""

from __future__ import annotations

from collections.abc import Iterable


def corroborated_max(
    values_by_peer: Iterable[tuple[str, int]], default: int = -1, lone_stands: bool = True
) -> int:
    """The highest value that at least two distinct peers report (each peer's highest counts once);
    the only peer's value if there is one peer and ``lone_stands``; ``default`` if none.

    ``lone_stands=False`` where the reporters are a subset of a larger swarm (records fresh enough to
    count): one reporter then is not the whole swarm speaking, only whoever published last, and a
    liar that keeps publishing is the one reporter whenever the honest peers are quiet."""
    best: dict[str, int] = {}
    for peer, value in values_by_peer:
        best[peer] = max(value, best.get(peer, value))
    ranked = sorted(best.values(), reverse=True)
    if not ranked or (len(ranked) == 1 and not lone_stands):
        return default
    return ranked[1] if len(ranked) >= 2 else ranked[0]
