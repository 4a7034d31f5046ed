"""The outer step of a round that ends an outer period (``sync = "outer"``; :mod:`peer.outer_step`
says what it computes and why).

The exchange reuses the round's machinery whole: the cohort's averager carries the pseudo-gradient
(the same shapes as a gradient) cohort -> across cohorts -> back, exact over whoever came, and the
commit board decides by quorum of the whole roster which result the swarm takes. Its groups are keyed
by the *outer* state's digest (anchor and outer momentum), which every peer shares although the
cohorts' parameters have drifted apart; its attempt is the one after the round's own.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

import torch

from peer.hierarchy import AveragingOutcome, HierarchicalAverager
from peer.outer_step import OuterSettings, OuterState, nesterov_outer_step
from peer.round_types import OuterReport, RoundPlan
from peer.worker_pool import WorkerPool
from supernet.state import digest

logger = logging.getLogger("manta.peer")


class OuterStepper:
    """Holds a peer's :class:`OuterState` and takes its outer steps. The workers' state buffer is the
    agent's view of the parameters: the first ``params`` tensors, then the inner optimizer state up
    to ``consensus``."""

    def __init__(
        self,
        settings: OuterSettings,
        state: OuterState,
        workers: WorkerPool,
        worker_state: list[torch.Tensor],
        consensus: int,
        fresh_optimizer_state: Sequence[torch.Tensor],
    ):
        self.settings, self.state = settings, state
        self._workers, self._worker_state, self._consensus = workers, worker_state, consensus
        self._params = len(state.anchor)
        self._fresh_optimizer = [t.clone() for t in fresh_optimizer_state]

    def outer_digest(self) -> str:
        """Digest of what every peer shares between outer steps: the anchor and the outer momentum."""
        return digest([*self.state.anchor, *self.state.momentum])

    def params(self) -> list[torch.Tensor]:
        return self._worker_state[: self._params]

    def step(
        self,
        averager: HierarchicalAverager,
        plan: RoundPlan,
        attempt: int,
        superseded: Callable[[], bool] = lambda: False,
    ) -> OuterReport:
        """Exchange this cohort's pseudo-gradient in ``attempt`` and, if a quorum of ``plan.roster``
        holds the average, take the outer step: parameters, anchor and momentum replaced, the inner
        optimizer state fresh. Otherwise nothing changes (the residue included): the next outer step
        sends this period's progress again, with the next one's."""
        started = time.perf_counter()
        sent, residue = self.state.outgoing(self.params(), self.settings.compression)
        outer_digest = self.outer_digest()
        outcome: AveragingOutcome = averager.average(
            attempt,
            sent,
            1,  # every member weighs the same: cohorts weigh by their members (samples = members)
            cohort_size=plan.cohort_size,
            num_cohorts=plan.num_cohorts,
            cohort_rank=plan.cohort_rank,
            state_digest=outer_digest,
            expected_peers=plan.roster,
            cohorts=plan.cohorts,
            superseded=superseded,
        )
        report = OuterReport(
            attempt,
            outcome.committed,
            outcome.reason,
            len(outcome.contributors),
            len({c.cohort for c in outcome.contributors}),
            result_digest=outcome.digest,
            stages={k: round(v, 4) for k, v in outcome.seconds.items()},
        )
        if outcome.committed:
            self._apply(outcome.tensors, residue)
        report.outer_digest = self.outer_digest()
        report.seconds = time.perf_counter() - started
        return report

    def _apply(self, average: Sequence[torch.Tensor], residue: list[torch.Tensor]) -> None:
        params, momentum = nesterov_outer_step(
            self.state.anchor, self.state.momentum, average, self.settings.lr, self.settings.momentum
        )
        self.state = OuterState([p.clone() for p in params], momentum, residue)
        for dst, src in zip(self._worker_state[: self._params], params):
            dst.copy_(src)
        for dst, src in zip(self._worker_state[self._params : self._consensus], self._fresh_optimizer):
            dst.copy_(src)
        self._workers.load(self._worker_state)
