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


def corroborated_max(values_by_peer: Iterable[tuple[str, int]], default: int = -1) -> int:
    """The highest value that at least two distinct peers report (each peer's highest counts once);
    the only peer's value if there is one peer; ``default`` if none."""
    best: dict[str, int] = {}
    for peer, value in values_by_peer:
        best[peer] = max(value, best.get(peer, value))
    ranked = sorted(best.values(), reverse=True)
    if not ranked:
        return default
    return ranked[1] if len(ranked) >= 2 else ranked[0]
