"""How often the desk answers an unauthenticated, ledger-reading call (``credits``): a token bucket per
caller's peer id and one for all callers together, so neither one caller nor many throw-away peer ids
can keep the ledger's single writer busy."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable

CALLERS_KEPT = 4096  # callers whose buckets are remembered (the least recently seen go first)


class CallBudget:
    """``per_caller`` calls per ``period`` seconds for each caller, at most ``overall`` for all."""

    def __init__(
        self,
        per_caller: int,
        overall: int,
        period: float,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.per_caller, self.overall, self.period, self.clock = per_caller, overall, period, clock
        self._lock = threading.Lock()  # guards _callers and _all (handler threads)
        self._callers: OrderedDict[str, tuple[float, float]] = OrderedDict()  # caller -> (tokens, at)
        self._all = (float(overall), clock())

    def _refill(self, bucket: tuple[float, float], size: int, now: float) -> float:
        tokens, at = bucket
        return min(float(size), tokens + (now - at) * size / self.period)

    def allow(self, caller: str) -> bool:
        """Whether ``caller`` may be answered now (a call allowed spends one token of each bucket)."""
        with self._lock:
            now = self.clock()
            mine = self._refill(
                self._callers.get(caller, (float(self.per_caller), now)), self.per_caller, now
            )
            everyone = self._refill(self._all, self.overall, now)
            allowed = mine >= 1.0 and everyone >= 1.0
            if allowed:
                mine, everyone = mine - 1.0, everyone - 1.0
            self._callers[caller] = (mine, now)
            self._callers.move_to_end(caller)
            while len(self._callers) > CALLERS_KEPT:
                self._callers.popitem(last=False)
            self._all = (everyone, now)
            return allowed
