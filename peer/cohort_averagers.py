"""The averagers a peer keeps for its cohort: one for its rounds and, in ``sync = "outer"`` tasks, one
for its outer steps. They are apart because an overlapped outer exchange runs while the rounds go on:
they must share neither a buffer nor groups, and outer steps are numbered on a commit board of their
own (attempt k: the k-th period's end), so every cohort meets on the same attempt whatever its
rounds' attempts were. A peer that changes cohort gets new averagers and the old ones are shut down;
what the rounds' stages took so far (their deadlines) carries over, the machine and links being the
same."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence

import torch

from hivemind_adapter.group_keys import DeclarationSigner
from hivemind_adapter.robust_reduce import RobustConfig
from peer.averaging_stage import AveragingTimeouts
from peer.conviction_watch import ConvictionWatch
from peer.hierarchy import HierarchicalAverager
from peer.round_commit import CommitBoard
from protocol.task_spec import TaskSpec


class CohortAveragers:
    def __init__(
        self,
        dht,
        task: TaskSpec,
        template: Sequence[torch.Tensor],
        *,
        timeouts: AveragingTimeouts,
        client_mode: bool,
        round_board: CommitBoard,
        outer_board: CommitBoard | None,
        leaving: Callable[[], bool],
        online: Callable[[], Collection[str]],
        on_new: Callable[[], None] = lambda: None,
        declarations: DeclarationSigner | None = None,
        admitted: Callable[[], Mapping[str, str]] | None = None,
        serves_cohort: Callable[[str], bool] = lambda cohort: False,
        convictions: ConvictionWatch | None = None,
        on_ended: Callable[[str], None] = lambda reason: None,
    ):
        self.dht, self.task, self.template = dht, task, list(template)
        self.timeouts, self.client_mode = timeouts, client_mode
        # whether a client-mode peer's cohort reaches it on its LAN (peer.affinity.cohort_on_lan)
        self.serves_cohort = serves_cohort
        self.round_board, self.outer_board = round_board, outer_board
        self.leaving, self.online, self.on_new = leaving, online, on_new
        self.declarations, self.admitted = (
            declarations,
            admitted,
        )  # matchmaking's (hivemind_adapter.group_keys)
        self.convictions = convictions  # reducers convicted of equivocation (peer.conviction_watch)
        self.current: HierarchicalAverager | None = None  # the rounds' averager
        self.current_outer: HierarchicalAverager | None = None
        self._retired_bytes = 0  # cross-cohort bytes of the averagers shut down so far
        self.on_ended = on_ended  # told once, why, if a process of an averager in use ended
        self._ended_told = False

    def rounds(self, cohort: str) -> HierarchicalAverager:
        """The cohort's averager for its rounds."""
        if self.current is not None and self.current.cohort == cohort:
            self._check(self.current)
            return self.current
        deadlines = None
        if self.current is not None:
            deadlines = self.current.deadlines
            self._retire(self.current)
        params = self.task.params
        self.current = HierarchicalAverager(
            self.dht,
            self.task.task_id,
            cohort,
            self.template,
            timeouts=self.timeouts,
            client_mode=self.client_mode,
            serves_cohort=self.serves_cohort(cohort),
            cross_codec="fp16" if params.cross_cohort_fp16 else "none",
            cross_group_size=params.cross_group_size,
            per_cohort=self.task.mode == "model",
            pairs_held_to_cohort_noise=True,
            commit_board=self.round_board,
            leaving=self.leaving,
            deadlines=deadlines,
            online=self.online,
            declarations=self.declarations,
            admitted=self.admitted,
            robust=RobustConfig() if params.robust_averaging else None,
            convictions=self.convictions,
        )
        self.on_new()
        return self.current

    def outer(self, cohort: str) -> HierarchicalAverager:
        """The cohort's averager for its outer exchanges: pseudo-gradients cross cohorts through the
        task's codec; in model-parallel tasks with the touched-weights mask beside them
        (:mod:`peer.outer_round`), so its vector is the parameters' twice."""
        if self.current_outer is not None and self.current_outer.cohort == cohort:
            self._check(self.current_outer)
            return self.current_outer
        if self.current_outer is not None:
            self._retire(self.current_outer)
        params = self.task.params
        self.current_outer = HierarchicalAverager(
            self.dht,
            f"{self.task.task_id}_outer",
            cohort,
            [*self.template, *self.template] if self.task.mode == "model" else self.template,
            timeouts=self.timeouts,
            client_mode=self.client_mode,
            serves_cohort=self.serves_cohort(cohort),
            cross_codec=params.outer_compression,
            cross_group_size=params.cross_group_size,
            commit_board=self.outer_board,
            leaving=self.leaving,
            online=self.online,
            declarations=self.declarations,
            admitted=self.admitted,
            robust=RobustConfig() if params.robust_averaging else None,
            convictions=self.convictions,
        )
        self.on_new()
        return self.current_outer

    def cross_cohort_bytes(self) -> int:
        """Payload bytes this peer's all-reduces moved across cohorts since it started."""
        live = sum(a.cross_cohort_bytes() for a in (self.current, self.current_outer) if a is not None)
        return self._retired_bytes + live

    def _check(self, averager: HierarchicalAverager) -> None:
        # A process of it ended (killed, out of memory): its calls and steps fail at once
        # (AveragerGone), and a new averager for the same cohort cannot take its place on this node
        # (measured: p2pd keeps the ended process's handlers, "handler ... already set"). So the peer
        # is told once, and stops in one line rather than fail every round.
        reason = averager.ended()
        if reason is not None and not self._ended_told:
            self._ended_told = True
            self.on_ended(reason)

    def _retire(self, averager: HierarchicalAverager) -> None:
        self._retired_bytes += averager.cross_cohort_bytes()
        averager.shutdown()

    def public_keys(self) -> dict[str, str]:
        """The keys (peer id -> hex) the rounds' averager admitted recently: whose signatures count."""
        averager = self.current
        return (averager.public_keys() if averager is not None else None) or {}

    def shutdown(self) -> None:
        for averager in (self.current, self.current_outer):
            if averager is not None:
                try:
                    averager.shutdown()
                except Exception:  # already gone with its process: nothing left to stop
                    pass
