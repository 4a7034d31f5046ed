"""Validation metrics of the aggregator's checkpoints, for the dashboard's accuracy curve.

The aggregator writes ``checkpoints/round-NNNNNNNN.pt`` as the swarm commits rounds. When a newer one
appears, this module loads it (:func:`supernet.checkpoint.load_checkpoint`, digest-checked) and
evaluates the largest and the smallest sub-network on the task's validation set
(:meth:`supernet.workload.Workload.evaluate`, which recalibrates batch norm first). At most one
evaluation runs at a time, in a background thread with one torch thread, so the aggregator's own work
(DHT, checkpoint downloads, HTTP) is not starved; checkpoints written while it runs are skipped in
favour of the newest. After an evaluation that took ``d`` seconds the next waits ``d * (1/duty - 1)``
seconds, so evaluating uses at most ``duty`` of one core however often checkpoints arrive.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from aggregator.checkpoints import newest_checkpoint
from supernet.checkpoint import load_checkpoint

logger = logging.getLogger(__name__)


def checkpoint_round(path: Path) -> int:
    """The round in a checkpoint file's name (``round-00000012.pt`` -> 12)."""
    return int(path.stem.split("-")[1])


def evaluate_checkpoint(path: Path, task: Any = None) -> tuple[dict[str, Any], Any]:
    """Evaluate the largest and smallest sub-network of checkpoint ``path``.

    Returns the result row for the dashboard and the loaded task (pass it back as ``task`` next time:
    loading the dataset once is enough). Raises :class:`supernet.checkpoint.CheckpointError`.
    """

    started = time.monotonic()
    # No lock against a spot audit in another thread: building the net and recalibrating BN draw from
    # generators of their own, never from torch's global one (supernet.workload).
    loaded = load_checkpoint(path, task=task)
    net, workload = loaded.net, loaded.workload
    rows = workload.evaluate(net, {"largest": net.largest_config(), "smallest": net.smallest_config()})
    metric = workload.metric_name
    result = {
        "metric": metric,
        "higher_is_better": workload.higher_is_better,
        **{row["name"]: float(row[metric]) for row in rows},
        "checkpoint": path.name,
        "seconds": round(time.monotonic() - started, 3),
        "evaluated_at": time.time(),
    }
    return result, workload.task


class CheckpointEvaluator:
    """Evaluates the newest not-yet-evaluated checkpoint in ``directory``, one at a time."""

    def __init__(
        self,
        directory: Path,
        on_result: Callable[[int, dict[str, Any]], None],
        *,
        task: Any = None,
        torch_threads: int = 1,
        duty: float = 0.25,
    ):
        self.directory, self.on_result = Path(directory), on_result
        self.task, self.torch_threads, self.duty = task, torch_threads, duty
        self._not_before = 0.0  # monotonic time before which no evaluation starts
        self.newest_done = -2  # rounds of checkpoints; -1 is the initial state
        self.last_error: str | None = None
        self.evaluations = 0
        self._thread: threading.Thread | None = None

    @property
    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def poll(self) -> bool:
        """Start evaluating the newest checkpoint if it is new and nothing is running; True if started."""

        if self.busy or time.monotonic() < self._not_before:
            return False
        path = newest_checkpoint(self.directory)
        if path is None or checkpoint_round(path) <= self.newest_done:
            return False
        self._thread = threading.Thread(
            target=self._run, args=(path,), name="manta-monitor-eval", daemon=True
        )
        self._thread.start()
        return True

    def _run(self, path: Path) -> None:

        torch.set_num_threads(self.torch_threads)
        round_index = checkpoint_round(path)
        started = time.monotonic()
        try:
            result, self.task = evaluate_checkpoint(path, self.task)
        except Exception as e:  # a checkpoint replaced or pruned mid-read, an unusable file
            self.last_error = f"{path.name}: {type(e).__name__}: {e}"
            logger.warning(f"monitor: could not evaluate checkpoint {self.last_error}")
        else:
            self.last_error = None
            self.evaluations += 1
            self.on_result(round_index, result)
            logger.info(
                f"checkpoint of round {round_index}: {result['metric']} largest {result['largest']:.4f}, "
                f"smallest {result['smallest']:.4f} ({result['seconds']:.1f} s)"
            )
        self.newest_done = max(self.newest_done, round_index)
        took = time.monotonic() - started
        self._not_before = time.monotonic() + took * (1 / self.duty - 1)

    def wait(self, timeout: float | None = None) -> None:
        """Wait for a running evaluation (tests; shutdown does not wait long)."""
        if self._thread is not None:
            self._thread.join(timeout)
