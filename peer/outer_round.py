"""The outer step at the end of an outer period (``sync = "outer"``; :mod:`peer.outer_step` says what
it computes and why), blocking or overlapped with the next period.

The exchange reuses the round's machinery whole: an averager of its own (groups apart from the inner
steps', which go on meanwhile) carries the pseudo-gradient cohort -> across cohorts -> back, exact over
whoever came, and the commit board decides by a quorum of the whole roster which result the swarm
takes. Its groups are keyed by the digest of the global parameters and outer momentum, which every
peer shares although the cohorts' parameters have drifted apart; its attempt is the one after the
round's own.

Overlapped (``outer_overlap``, as in Streaming / eager DiLoCo): at the end of period k the exchange of
period k's progress starts in the background and period k+1 trains on from where period k ended. At
the end of period k+1 the exchange is (normally long) done: the outer step it decided moves the global
parameters, and the cohort's parameters become the new global parameters plus the cohort's own
progress of period k+1, which it sends next. Compute waits for the wide-area link only when an
exchange outlasts a whole period. An exchange that did not commit leaves the global state as it was;
its period's progress is sent again with the next one.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch

from peer.averaging.hierarchy import HierarchicalAverager
from peer.averaging.outcome import AveragingOutcome
from peer.outer_step import OuterSettings, nesterov_outer_step, outgoing
from peer.round_types import OuterReport, RoundPlan
from peer.worker_pool import WorkerPool
from supernet.outer_state import OuterState, outer_digest

logger = logging.getLogger("manta.peer")

# At most this long a period's end waits for the previous period's exchange (each of its stages and
# its commit are bounded on their own; this bounds their sum).
EXCHANGE_WAIT_SECONDS = 600.0


@dataclass
class _Exchange:
    """An exchange under way in the background, and what to restore if it does not commit."""

    attempt: int
    base: str  # the outer digest it started from: its result applies only to that state
    residue: list[torch.Tensor]  # the residue if it commits
    anchor_before: list[torch.Tensor]  # the anchor and residue to restore if it does not
    residue_before: list[torch.Tensor]
    started: float
    thread: threading.Thread
    touched: list[torch.Tensor] | None = None  # model-parallel: its period's touched weights
    outcome: AveragingOutcome | None = None


class OuterStepper:
    """Holds a peer's :class:`OuterState` and takes its outer steps. The workers' state buffer is the
    agent's view of the parameters: the first ``len(anchor)`` tensors, then the inner optimizer state
    up to ``consensus``."""

    def __init__(
        self,
        settings: OuterSettings,
        state: OuterState,
        workers: WorkerPool,
        worker_state: list[torch.Tensor],
        consensus: int,
        fresh_optimizer_state: Sequence[torch.Tensor],
        averager_for: Callable[[str], HierarchicalAverager],
        mask_aware: bool = False,
    ):
        self.settings, self.state = settings, state
        self._averager_for = averager_for  # the cohort's outer averager: its groups apart from the rounds'
        self._workers, self._worker_state, self._consensus = workers, worker_state, consensus
        self._params = len(state.anchor)
        self._fresh_optimizer = [t.clone() for t in fresh_optimizer_state]
        self._pending: _Exchange | None = None
        self.steps_taken = 0  # outer steps this peer applied
        self.steps_adopted = 0  # outer steps it missed and took from the others' states (adopt_global)
        self._running: threading.Thread | None = None  # the last exchange's thread, even one dropped
        # when this period began (the first: when the peer set out): the cohorts' drift is up to a period
        self._period_started = time.perf_counter()
        # Model-parallel tasks: which weights this cohort's sub-networks touched this period (a nonzero
        # averaged gradient in any inner step). The exchange carries the touched pseudo-gradient and
        # the mask, so each weight is averaged over the cohorts that trained it (averager template:
        # the parameters twice).
        self._touched = [torch.zeros(a.shape, dtype=torch.bool) for a in state.anchor] if mask_aware else None

    def outer_digest(self) -> str:
        """This peer's :func:`~supernet.outer_state.outer_digest`."""
        return outer_digest(self.state)

    def params(self) -> list[torch.Tensor]:
        return self._worker_state[: self._params]

    def note_inner_step(self, average: Sequence[torch.Tensor]) -> None:
        """A committed inner step's averaged gradient (model-parallel: what it touched)."""
        if self._touched is not None:
            for t, g in zip(self._touched, average):
                t |= g != 0

    def replace_state(self, state: OuterState) -> None:
        """A downloaded state replaced this peer's: an exchange under way started from the old one."""
        self.state, self._pending = state, None

    def adopt_global(self, global_params: Sequence[torch.Tensor], momentum: Sequence[torch.Tensor]) -> None:
        """This peer missed an outer step that the others took (:mod:`peer.outer_repair`): take the
        outer state they reached, and shift the parameters and the period's anchor by the same global
        step. The cohort's own progress (anchor minus parameters) is kept whole and goes out with its
        next exchange, as after any exchange that did not commit here. An exchange still under way
        started from the old outer state and can meet nobody: dropped, its period's progress kept."""
        if self._pending is not None:
            dropped, self._pending = self._pending, None
            self.state = replace(self.state, anchor=dropped.anchor_before, residue=dropped.residue_before)
            self._restore_touched(dropped.touched)
        shift = [new - old for new, old in zip(global_params, self.state.global_params)]
        self._set_params([p + d for p, d in zip(self.params(), shift)], fresh_optimizer=False)
        self.state = replace(
            self.state,
            global_params=[g.clone() for g in global_params],
            momentum=[m.clone() for m in momentum],
            anchor=[a + d for a, d in zip(self.state.anchor, shift)],
        )
        self.steps_adopted += 1

    # ------------------------------------------------------------------ the period's end

    def step(
        self, plan: RoundPlan, attempt: int, superseded: Callable[[], bool] = lambda: False
    ) -> OuterReport | None:
        """The end of an outer period, exchanging in ``attempt``. Blocking: the exchange and its step
        (the report says how it went). Overlapped: the previous period's step (its report; None at
        the first period's end), then this period's exchange starts in the background."""
        started = time.perf_counter()
        averager = self._averager_for(plan.cohort)
        # The other cohorts reach this exchange up to a period later (each trains at its own pace):
        # overlapped, waiting for them costs nothing while the next period trains; blocking, it is the
        # outer step's barrier, and giving up splits the swarm's step (peer.averaging.deadlines says more).
        period, self._period_started = started - self._period_started, started
        averager.deadlines.allow_drift(min(period, EXCHANGE_WAIT_SECONDS))
        if not self.settings.overlap:
            report = self._exchange_now(averager, plan, attempt, superseded)
            report.blocked_seconds = time.perf_counter() - started
            return report
        report = self._finish_pending()
        touched = self._touched_so_far()
        sent, residue = self._outgoing()
        if report is not None and report.committed:
            # The cohort's parameters: the new global ones plus this period's own progress (whose
            # pseudo-gradient is ``sent``'s source), so the global step replaces the period it covers.
            progress = [a - p for a, p in zip(self.state.anchor, self.params())]
            self._set_params(
                [g - d for g, d in zip(self.state.global_params, progress)], fresh_optimizer=False
            )
        self._launch(averager, plan, attempt, sent, residue, touched)
        if report is not None:
            report.blocked_seconds = time.perf_counter() - started
        return report

    def finish(self, timeout: float = EXCHANGE_WAIT_SECONDS) -> OuterReport | None:
        """The run's end: take the step of the exchange under way (waiting at most ``timeout`` s), then
        end on the global parameters with a fresh inner optimizer state: the state every peer that
        took the same steps holds (a cohort's progress since the last exchange is not the swarm's)."""
        report = self._finish_pending(timeout)
        self._set_params(self.state.global_params, fresh_optimizer=True)
        self.state = replace(self.state, anchor=[g.clone() for g in self.state.global_params])
        return report

    # ------------------------------------------------------------------ parts

    def _exchange_now(
        self, averager: HierarchicalAverager, plan: RoundPlan, attempt: int, superseded: Callable[[], bool]
    ) -> OuterReport:
        started = time.perf_counter()
        touched = self._touched_so_far()
        sent, residue = self._outgoing()
        outcome = _average(averager, plan, attempt, sent, self.outer_digest(), superseded)
        if not outcome.committed:
            self._restore_touched(touched)
        if outcome.committed:
            self._apply(outcome.tensors, residue)
            self._set_params(self.state.global_params, fresh_optimizer=True)
            self.state = replace(self.state, anchor=[g.clone() for g in self.state.global_params])
        return self._report(attempt, outcome, time.perf_counter() - started)

    def _launch(
        self,
        averager: HierarchicalAverager,
        plan: RoundPlan,
        attempt: int,
        sent: list[torch.Tensor],
        residue: list[torch.Tensor],
        touched: list[torch.Tensor] | None = None,
    ) -> None:
        if self._running is not None:  # a dropped exchange still runs on this averager: let it end first
            self._running.join(EXCHANGE_WAIT_SECONDS)
        base = self.outer_digest()
        exchange = _Exchange(
            attempt,
            base,
            residue,
            self.state.anchor,
            self.state.residue,
            time.perf_counter(),
            threading.Thread(),
            touched,
        )

        def run() -> None:
            # The swarm goes on to later rounds meanwhile: only a newer outer state supersedes it.
            exchange.outcome = _average(averager, plan, attempt, sent, base, lambda: False)

        exchange.thread = threading.Thread(target=run, name=f"outer-exchange-{attempt}", daemon=True)
        # The next period starts from here, and sends this period's residue only if this one commits.
        self.state = replace(self.state, anchor=[p.clone() for p in self.params()], residue=residue)
        self._pending, self._running = exchange, exchange.thread
        exchange.thread.start()

    def _finish_pending(self, timeout: float = EXCHANGE_WAIT_SECONDS) -> OuterReport | None:
        """Wait for the exchange under way (bounded) and take its step; None if there was none."""
        exchange, self._pending = self._pending, None
        if exchange is None:
            return None
        exchange.thread.join(timeout)
        outcome = exchange.outcome
        if outcome is None:
            outcome = AveragingOutcome(committed=False, reason=f"no outcome within {timeout:.0f} s")
        elif outcome.committed and exchange.base != self.outer_digest():
            outcome = AveragingOutcome(committed=False, reason="the outer state changed while it ran")
        if outcome.committed:
            self._apply(outcome.tensors, self.state.residue)
        else:
            # Its period's progress goes out again with the next one's: back to that period's anchor.
            self.state = replace(self.state, anchor=exchange.anchor_before, residue=exchange.residue_before)
            self._restore_touched(exchange.touched)
        # the exchange's own duration (it ran in the background; collected at this period's end)
        return self._report(
            exchange.attempt, outcome, outcome.seconds.get("total", time.perf_counter() - exchange.started)
        )

    def _outgoing(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """What this cohort sends (model-parallel: the touched pseudo-gradient and the mask; untouched
        weights keep their residue) and its residue if the exchange commits; the next period's touched
        weights start anew."""
        sent, residue = outgoing(self.state, self.params(), self.settings.compression)
        if self._touched is None:
            return sent, residue
        touched, self._touched = self._touched, [torch.zeros_like(t) for t in self._touched]
        sent = [torch.where(m, s, torch.zeros_like(s)) for m, s in zip(touched, sent)]
        residue = [torch.where(m, r, old) for m, r, old in zip(touched, residue, self.state.residue)]
        return [*sent, *(m.to(s.dtype) for m, s in zip(touched, sent))], residue

    def _touched_so_far(self) -> list[torch.Tensor] | None:
        return None if self._touched is None else [t.clone() for t in self._touched]

    def _restore_touched(self, touched: list[torch.Tensor] | None) -> None:
        """An exchange that did not commit: its period's weights go out with the next one's."""
        if touched is not None and self._touched is not None:
            for now, before in zip(self._touched, touched):
                now |= before

    def _apply(self, average: Sequence[torch.Tensor], residue: list[torch.Tensor]) -> None:
        """The outer Nesterov step on the global parameters (the cohort's parameters are the caller's)."""
        self.steps_taken += 1
        if self._touched is not None:  # the members-weighted sums over the cohorts that touched each weight
            n = len(self.state.anchor)
            average = [
                torch.where(m > 0, d / m.clamp_min(1e-12), torch.zeros_like(d))
                for d, m in zip(average[:n], average[n:])
            ]
        params, momentum = nesterov_outer_step(
            self.state.global_params, self.state.momentum, average, self.settings.lr, self.settings.momentum
        )
        self.state = replace(self.state, global_params=params, momentum=momentum, residue=residue)

    def _set_params(self, params: Sequence[torch.Tensor], *, fresh_optimizer: bool) -> None:
        for dst, src in zip(self._worker_state[: self._params], params):
            dst.copy_(src)
        if fresh_optimizer:
            for dst, src in zip(self._worker_state[self._params : self._consensus], self._fresh_optimizer):
                dst.copy_(src)
        self._workers.load(self._worker_state)

    def _report(self, attempt: int, outcome: AveragingOutcome, seconds: float) -> OuterReport:
        return OuterReport(
            attempt,
            outcome.committed,
            outcome.reason,
            len(outcome.contributors),
            len({c.cohort for c in outcome.contributors}),
            seconds=seconds,
            result_digest=outcome.digest,
            outer_digest=self.outer_digest(),
            stages={k: round(v, 4) for k, v in outcome.seconds.items()},
        )


def _average(
    averager: HierarchicalAverager,
    plan: RoundPlan,
    attempt: int,
    sent: list[torch.Tensor],
    base: str,
    superseded: Callable[[], bool],
) -> AveragingOutcome:
    """One exchange: every member weighs the same, so cohorts weigh by their members."""
    return averager.average(
        attempt,
        sent,
        1,
        cohort_size=plan.cohort_size,
        num_cohorts=plan.num_cohorts,
        cohort_rank=plan.cohort_rank,
        state_digest=base,
        expected_peers=plan.roster,
        cohorts=plan.cohorts,
        superseded=superseded,
    )
