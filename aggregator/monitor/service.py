"""The monitor as the aggregator runs it: collector, evaluator, ledger view, round history (and
TensorBoard log) and web server together.

:class:`Monitor` is created before the DHT node starts (``serve`` binds the HTTP port first, so a
taken port fails at once; without a dashboard it is not called), then ``watch`` hands it the
published task and a way to read the DHT, which starts the collector. Its ``status``/``rounds``/
``peers``/``ledger``/``proof``/``metrics`` methods are what the HTTP routes return; each builds a
fresh JSON-able value and changes nothing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aggregator.checkpoints import newest_checkpoint
from aggregator.monitor.aggregates import SwarmAggregates
from aggregator.monitor.collector import DEFAULT_INTERVAL, Collector
from aggregator.monitor.evaluation import CheckpointEvaluator, checkpoint_round
from aggregator.monitor.history import HISTORY_FILE, RoundHistory
from aggregator.monitor.ledger_view import LEDGER_FILE, LedgerView
from aggregator.monitor.metrics import render_metrics
from aggregator.monitor.server import DashboardServer
from aggregator.monitor.swarm_reader import SwarmReading
from protocol.identity import fingerprint
from protocol.task_spec import TaskSpec

logger = logging.getLogger(__name__)


def _phase_namer(task: TaskSpec) -> Callable[[int], str | None]:
    """round -> the schedule phase it is in (``sandwich``, ``kernel``, ``depth-2``, ...)."""
    try:
        from supernet.training.schedule import phase_at
        from supernet.workload import swarm_train_options, train_config

        cfg = train_config(task.task, swarm_train_options(task))
    except Exception as e:  # an unknown task here: the dashboard just shows no phase
        logger.debug(f"no schedule for the dashboard: {e}")
        return lambda _round: None

    def name(round_index: int) -> str | None:
        phase = phase_at(max(0, round_index), cfg)
        return phase.name if phase.stage == 0 else f"{phase.name}-{phase.stage + 1}"

    return name


class Monitor:
    def __init__(
        self,
        data_dir: Path,
        public_key: bytes,
        *,
        interval: float = DEFAULT_INTERVAL,
        evaluate: bool = True,
        fresh_seconds: float = 5.0,
        tensorboard=None,
    ):
        """``tensorboard``: a :class:`~aggregator.monitor.tensorboard.TensorBoardLog` the round history
        is also written to. The history in ``data_dir`` is read back first (a restarted run)."""
        self.data_dir = Path(data_dir)
        self.public_key = public_key
        self.interval, self.fresh_seconds = interval, fresh_seconds
        self.aggregates = SwarmAggregates()
        self.history = RoundHistory(self.data_dir / HISTORY_FILE, tensorboard)
        self.aggregates.restore(self.history.rows)
        for index, result in self.history.validations.items():
            self.aggregates.record_validation(index, result)
        self.ledger_view = LedgerView(self.data_dir / LEDGER_FILE)
        self.checkpoints = self.data_dir / "checkpoints"
        self.evaluator = (
            CheckpointEvaluator(self.checkpoints, self.aggregates.record_validation) if evaluate else None
        )
        self.task: TaskSpec | None = None
        self.multiaddrs: list[str] = []
        self.started = time.time()
        self.collector: Collector | None = None
        self.server = None
        self.url: str | None = None
        self._phase: Callable[[int], str | None] = lambda _round: None
        self._data_served: Callable[[], int] | None = None

    # ------------------------------------------------------------------ life cycle

    def serve(self, address: str, *, fallback: bool = False) -> str:
        """Start the web server on ``address`` (HOST:PORT); returns its URL. DashboardError if it cannot
        listen there (with ``fallback``, a taken port is replaced by a free one on the same host)."""

        self.server = DashboardServer(self)
        self.url = self.server.start(address, fallback=fallback)
        return self.url

    def watch(
        self,
        task: TaskSpec,
        read: Callable[[], SwarmReading] | None = None,
        *,
        multiaddrs: list[str] | None = None,
        task_data: Any = None,
        data_served: Callable[[], int] | None = None,
    ) -> None:
        """Follow ``task``; with ``read``, start the collector thread that calls it every interval.
        ``task_data`` is an already loaded :class:`tasks.Task` the evaluator may reuse;
        ``data_served`` the shard bytes the aggregator served (tasks on an operator's dataset)."""
        self.task = task
        self._data_served = data_served
        self.multiaddrs = list(multiaddrs or [])
        self._phase = _phase_namer(task)
        if self.evaluator is not None and task_data is not None:
            self.evaluator.task = task_data
        if read is not None:
            jobs = [self.ledger_view.refresh] + ([self.evaluator.poll] if self.evaluator else [])
            jobs.append(self.record_history)
            self.collector = Collector(read, self.aggregates, interval=self.interval, jobs=tuple(jobs))
            self.collector.start()

    def credit(self, round_index: int, samples: dict[str, int]) -> None:
        """What the contribution desk credited for a round it closed (peer id -> samples): the
        round's figures, and its history line is written from them (:meth:`SwarmAggregates.credit`)."""
        self.aggregates.credit(round_index, samples, time.time())

    def record_history(self) -> int:
        """Append what became final to the round history (a collector job); the lines written."""
        return self.history.update(self.aggregates)

    def close(self) -> None:
        """Stop the collector, write the rest of the round history, stop the web server."""
        if self.collector is not None:
            self.collector.stop()
            self.collector = None
        try:
            self.history.close(self.aggregates)
        except Exception as e:  # a full disk: the history so far is on disk, the shutdown goes on
            logger.warning(f"round history: {type(e).__name__}: {e}")
        if self.server is not None:
            self.server.stop()
            self.server = None

    # ------------------------------------------------------------------ views (what the API returns)

    def status(self) -> dict[str, Any]:
        now = time.time()
        aggregates = self.aggregates
        peers = aggregates.peers(now, self.fresh_seconds)
        online = [p for p in peers if p["online"]]
        rows = aggregates.rounds()
        current = aggregates.current_round()
        by_round = {r["round"]: r for r in rows}
        finished = [r for r in rows if current is not None and r["round"] < current and r["samples"]]
        target = self.task.params.target_samples_per_round if self.task else None
        samples = by_round[current]["samples"] if current in by_round else 0
        cohorts: dict[str, dict[str, Any]] = {}
        for p in online:
            c = cohorts.setdefault(
                p["cohort"] or "", {"cohort": p["cohort"] or "", "peers": 0, "throughput": 0.0}
            )
            c["peers"] += 1
            c["throughput"] += p["throughput"]
        return {
            "time": now,
            "task": self._task_info(),
            "aggregator": {
                "public_key": self.public_key.hex(),
                "fingerprint": fingerprint(self.public_key),
                "multiaddrs": self.multiaddrs,
                "started": self.started,
                "uptime_s": now - self.started,
                "dashboard": self.url,
            },
            "round": {
                "current": current,
                "phase": self._phase(current) if current is not None else None,
                "activity": aggregates.activity(now, self.fresh_seconds),
                "samples": samples,
                "target": target,
                "progress": min(1.0, samples / target) if target else None,
            },
            "last_round": finished[-1] if finished else None,
            "peers_online": len(online),
            "cohorts": sorted(cohorts.values(), key=lambda c: c["cohort"]),
            "throughput": sum(p["throughput"] for p in online),
            # sync = "outer": outer steps so far; every task: what crossed between cohorts
            "traffic": aggregates.traffic(),
            # tasks on an operator's dataset: shards, their holders, the bytes served (None: built-in data)
            "data": self._data_info(aggregates),
            "totals": {
                "rounds": sum(1 for r in rows if r["peers"]),
                "samples": sum(r["samples"] for r in rows),
            },
            "validation": aggregates.latest_validation(),
            "checkpoint": self._checkpoint_info(),
            "ledger": self.ledger_view.summary()["head"],
            "monitor": {
                "readings": aggregates.readings,
                "rejected": aggregates.rejected,
                "last_reading": aggregates.last_reading,
                "interval": self.interval,
                "evaluations": self.evaluator.evaluations if self.evaluator else 0,
                "evaluating": bool(self.evaluator and self.evaluator.busy),
                "error": (self.collector.last_error if self.collector else None)
                or (self.evaluator.last_error if self.evaluator else None),
            },
        }

    def _data_info(self, aggregates) -> dict[str, Any] | None:
        data = self.task.data if self.task is not None else None
        if data is None:
            return None
        served = self._data_served() if self._data_served is not None else 0
        return {
            "kind": data.kind,
            "layout": data.layout,
            "root": data.root,
            "train_samples": data.train_samples,
            "val_samples": data.val_samples,
            "bytes": data.bytes,
            **aggregates.data(data.shards, served),
        }

    def _task_info(self) -> dict[str, Any] | None:
        if self.task is None:
            return None
        t = self.task
        return {
            "task_id": t.task_id,
            "task": t.task,
            "mode": t.mode,
            "total_rounds": t.params.total_rounds,
            "target_samples_per_round": t.params.target_samples_per_round,
            "batch_size": t.params.batch_size,
            "subnets_per_step": t.params.subnets_per_step,
            "schedule": t.params.schedule,
            "sync": t.params.sync,
            "inner_steps": t.params.inner_steps if t.params.sync == "outer" else None,
            "outer_compression": t.params.outer_compression if t.params.sync == "outer" else None,
        }

    def _checkpoint_info(self) -> dict[str, Any] | None:

        path = newest_checkpoint(self.checkpoints)
        if path is None:
            return None
        try:
            written = path.stat().st_mtime
        except OSError:  # pruned just now
            return None
        return {"round": checkpoint_round(path), "file": path.name, "written": written}

    def rounds(self, since: int = 0) -> dict[str, Any]:
        return {"rounds": self.aggregates.rounds(since)}

    def peers(self) -> dict[str, Any]:
        return {"time": time.time(), "peers": self.aggregates.peers(time.time(), self.fresh_seconds)}

    def ledger(self) -> dict[str, Any]:
        return self.ledger_view.summary()

    def proof(self, index: int) -> dict[str, Any]:
        return self.ledger_view.proof(index)

    def metrics(self) -> str:
        return render_metrics(self.status(), self.peers()["peers"], self.ledger())
