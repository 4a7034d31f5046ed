"""How long a round's averaging stages wait for their partners, from what the swarm has been doing.

A fixed timeout is wrong both ways: long enough for the slowest link it makes every death cost that
long, and short enough for a fast swarm it cuts off a merely slow peer. So each stage (cohort, cross,
broadcast) keeps the time its last few successful rounds took to find their group and finish, and a
peer waits a few times the slowest of those before it goes on without the missing partners (or gives
the round up). Arrivals are spread by the last mini-batch each peer finishes and by link speed, and
both show in these figures. The wait never falls below a few matchmaking periods (hivemind forms a
group that is not full only after one) and never exceeds the configured step timeout, except by the
drift allowance below.

Cohorts drift apart between outer steps: each runs its inner steps at its own pace, so the heads reach
an exchange's cross stage as far apart as a period's worth of their speed difference. So an outer
exchange's averager (:mod:`peer.outer_round`) allows the period's length on top of the cross stage's
and the broadcast's waits. Overlapped, waiting that long costs no compute (the next period trains
meanwhile, and a head more than a period ahead blocks at its next period's end anyway); blocking, it is
the outer step's barrier, and giving up would split the swarm's step.

One peer thread uses an instance; nothing here is shared.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from dataclasses import dataclass

logger = logging.getLogger(__name__)

HISTORY = 8  # successful stages remembered per stage name
# the stages that wait for other cohorts (a broadcast: for its head's climb across them)
DRIFTING_STAGES = ("cross", "broadcast")


@dataclass(frozen=True)
class StageDeadline:
    """The wait chosen for one stage, and why (for the log line that explains a give-up)."""

    seconds: float
    slowest_recent: float | None  # None: no history yet, the initial wait
    drift: float = 0.0  # of ``seconds``, what the other cohorts may lag behind (allow_drift)

    def describe(self) -> str:
        allowance = f", {self.drift:.1f} s of it for the cohorts' drift" if self.drift else ""
        if self.slowest_recent is None:
            return f"{self.seconds:.1f} s (no history yet{allowance})"
        return f"{self.seconds:.1f} s (recent groups took up to {self.slowest_recent:.1f} s{allowance})"


class StageDeadlines:
    """``deadline(stage)`` = clamp(``factor`` x slowest recent stage + 2 matchmaking periods,
    3 matchmaking periods, ``ceiling``); ``initial`` until the stage has any history."""

    def __init__(
        self, matchmaking: float, ceiling: float, *, factor: float = 3.0, initial: float | None = None
    ):
        self.matchmaking, self.ceiling, self.factor = matchmaking, ceiling, factor
        self.floor = min(ceiling, 3.0 * matchmaking)
        self.initial = min(ceiling, initial if initial is not None else 10.0 * matchmaking)
        self._history: dict[str, deque[float]] = {}
        self._by_level: dict[tuple[str, int], deque[float]] = {}  # a tree level's own, apart
        self.drift = 0.0

    def allow_drift(self, seconds: float) -> None:
        """The other cohorts may reach this exchange up to ``seconds`` later than this peer: the
        cross stage and the broadcast wait that much longer, above the ceiling too."""
        self.drift = max(0.0, seconds)

    def record(self, stage: str, seconds: float, level: int = 0) -> None:
        """A stage that found its group and finished, in ``seconds`` from when this peer entered it
        (``level``: the cross-cohort tree's level it met at; 0: none)."""
        self._history.setdefault(stage, deque(maxlen=HISTORY)).append(max(0.0, seconds))
        if level:
            self._by_level.setdefault((stage, level), deque(maxlen=HISTORY)).append(max(0.0, seconds))

    def deadline(self, stage: str, ceiling: float | None = None, level: int = 0) -> StageDeadline:
        """The wait for ``stage``; ``ceiling`` overrides the default bound (the commit has its own).
        At a tree ``level`` that met before, from that level's history alone: a head that climbs to
        the top times its waits for the slowest cohorts there, and with those it would wait out its
        own low level longer than the partners above it wait for it."""
        chosen = self._deadline(stage, ceiling, self._by_level.get((stage, level)) if level else None)
        if stage not in DRIFTING_STAGES or not self.drift:
            return chosen
        return StageDeadline(chosen.seconds + self.drift, chosen.slowest_recent, self.drift)

    def _deadline(
        self, stage: str, ceiling: float | None, history: deque[float] | None = None
    ) -> StageDeadline:
        top = self.ceiling if ceiling is None else ceiling
        history = history or self._history.get(stage)
        if not history:
            wait = min(top, self.initial)
            if stage == "broadcast":
                # A member's broadcast wait begins as its head begins to climb across cohorts: until
                # a broadcast was timed (its history then holds that climb), it also waits out the
                # head's cross stage, or it could give up just before a slow head arrives.
                wait += self._deadline("cross", ceiling).seconds
            return StageDeadline(wait, None)
        slowest = max(history)
        wait = self.factor * slowest + 2.0 * self.matchmaking
        return StageDeadline(min(top, max(self.floor, wait)), slowest)

    def allreduce_bound(self, stage: str, ceiling: float, least: float) -> float:
        """How long one all-reduce of ``stage`` may run once its group formed: ``factor`` x the
        slowest recent stage (the group's wait included) + 2 matchmaking periods, whole seconds, at
        least ``least`` (hivemind drops a silent member sooner than that: a bound below it would cut
        short the all-reduce it would have finished without that member), at most ``ceiling``, which
        is also the bound while the stage has no history. Unlike :meth:`deadline`, not capped by the
        step timeout: that bounds the wait for a group, and a large model's all-reduce over a slow
        link may rightly take longer."""
        history = self._history.get(stage)
        if not history:
            return ceiling
        wait = self.factor * max(history) + 2.0 * self.matchmaking
        return float(min(ceiling, max(least, math.ceil(wait))))

    def total(self, levels: int = 1) -> float:
        """How long a whole attempt lasts at most, over the stages this peer has seen run: what a peer
        that failed early waits for the rest at most. ``levels``: the cross-cohort tree's depth this
        attempt (each level has its own cross stage and broadcast)."""
        # a member's broadcast waits for its leader's whole climb: one broadcast deadline per level
        per_level = {"cross": levels, "broadcast": levels}
        seen = [self.deadline(stage).seconds * per_level.get(stage, 1) for stage in self._history]
        return sum(seen) if seen else self.initial
