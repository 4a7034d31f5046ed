"""How one averager averages: :class:`AveragerSettings`, fixed for its life."""

from __future__ import annotations

from dataclasses import dataclass, field

from peer.averaging.cross_tree import DEFAULT_FANOUT
from peer.averaging.stage import AveragingTimeouts
from robust_aggregation.centered_clip import RobustConfig


@dataclass(frozen=True)
class AveragerSettings:
    """``per_cohort``: the model-parallel combination (the sum over cohorts of each cohort's mean)
    instead of the sample-weighted mean over every contributor. ``pairs_held_to_cohort_noise``: a
    cross stage of two heads holds its reducer to the sampling noise the same attempt's cohort stage
    measured (only where both stages average per-sample means). ``cross_codec``: how vectors cross
    between cohorts (:data:`hivemind_adapter.wire_codecs.CODECS`). ``client_mode``: this peer cannot
    be dialled; ``serves_cohort``: but its cohort reaches it on its host or LAN. ``robust``: reducers
    take CenteredClip (None: a plain mean)."""

    run_id: str
    cohort: str
    peer_id: str
    timeouts: AveragingTimeouts = field(default_factory=AveragingTimeouts)
    per_cohort: bool = False
    pairs_held_to_cohort_noise: bool = False
    cross_codec: str = "none"
    cross_group_size: int = DEFAULT_FANOUT
    client_mode: bool = False
    serves_cohort: bool = False
    robust: RobustConfig | None = None

    @property
    def cohort_client_mode(self) -> bool:
        """Whether this peer is a client in its cohort's stages too."""
        return self.client_mode and not self.serves_cohort

    @property
    def holds_pairs_to_noise(self) -> bool:
        return self.pairs_held_to_cohort_noise and not self.per_cohort
