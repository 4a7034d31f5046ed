"""The run's round history on disk, ``<data dir>/rounds.jsonl``, and optionally in TensorBoard.

One JSON object a line, appended as the monitor learns the figures (:mod:`.aggregates`), so the
history outlives the process and a restarted aggregator shows it again:

* ``{"kind": "round", "round", "time", "samples", "loss", "contributors", "peers_online",
  "throughput", "cohorts", "cross_cohort_bytes", "outer_steps"}`` once a round's figures are final
  (:meth:`SwarmAggregates.finished_rounds`), or when the monitor stops. ``time`` is when its figures
  last changed; ``contributors`` the peers that reported samples for it; ``peers_online``,
  ``cross_cohort_bytes`` (all peers' all-reduce bytes between cohorts so far) and ``outer_steps`` as
  they stand when the line is written.
* ``{"kind": "validation", "round", "time", "validation"}`` once a checkpoint of that round has been
  evaluated (:mod:`.evaluation`): ``validation`` holds the metric's name, whether higher is better,
  the largest and the smallest sub-network's value and the checkpoint's file name.

Each round and each validation is written once: those already in the file (an earlier run of the
same data directory) are not written again.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from aggregator.monitor.aggregates import SwarmAggregates

logger = logging.getLogger(__name__)

HISTORY_FILE = "rounds.jsonl"
QUIET_SECONDS = 10.0  # a round nobody reports about any more, unchanged this long, is final


class RoundHistory:
    """Appends to ``path`` (and to ``tensorboard``, a :class:`.tensorboard.TensorBoardLog`, if given)
    what :meth:`update` finds new in the aggregates. Reads what the file already holds at start."""

    def __init__(self, path: Path, tensorboard=None):
        self.path, self.tensorboard = Path(path), tensorboard
        self.rows: list[dict[str, Any]] = []  # the round lines read at start, as /api/rounds rows
        self.validations: dict[int, dict[str, Any]] = {}  # the validation lines read at start
        self._rounds: set[int] = set()
        self._validated: set[int] = set()
        self._read()

    def _read(self) -> None:
        try:
            lines = self.path.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            return
        for n, line in enumerate(lines, 1):
            try:
                record = json.loads(line)
                kind, index = record["kind"], int(record["round"])
            except (ValueError, KeyError, TypeError):
                logger.warning(f"{self.path}:{n}: not a round history line; skipped")
                continue
            if kind == "round":
                self._rounds.add(index)
                self.rows.append(_api_row(record))
            elif kind == "validation":
                self._validated.add(index)
                self.validations[index] = record.get("validation") or {}

    def update(self, aggregates: SwarmAggregates, *, final: bool = False, now: float | None = None) -> int:
        """Append the rounds that became final and the validations that arrived since the last call
        (``final``: every round with samples not written yet, the monitor is stopping). Returns how
        many lines were written."""
        now = time.time() if now is None else now
        if final:
            rows = [row for row in aggregates.rounds() if row["samples"] > 0]
        else:
            rows = aggregates.finished_rounds(now, QUIET_SECONDS)
        online = sum(1 for p in aggregates.peers(now) if p["online"])
        traffic = aggregates.traffic()
        lines = []
        for row in rows:
            if row["round"] in self._rounds:
                continue
            self._rounds.add(row["round"])
            line = {
                "kind": "round",
                "round": row["round"],
                "time": row["last_change"],
                "samples": row["samples"],
                "loss": row["loss"],
                "contributors": row["peers"],
                "peers_online": online,
                "throughput": row["throughput"],
                "cohorts": row["cohorts"],
                "cross_cohort_bytes": traffic["cross_cohort_bytes"],
                "outer_steps": traffic["outer_steps"],
            }
            lines.append(line)
            if self.tensorboard is not None:
                self.tensorboard.round(line)
        for index, result in sorted(aggregates.validations().items()):
            if index in self._validated:
                continue
            self._validated.add(index)
            line = {
                "kind": "validation",
                "round": index,
                "time": result.get("evaluated_at", now),
                "validation": {
                    k: result.get(k)
                    for k in ("metric", "higher_is_better", "largest", "smallest", "checkpoint")
                },
            }
            lines.append(line)
            if self.tensorboard is not None:
                self.tensorboard.validation(line)
        if lines:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write("".join(json.dumps(line) + "\n" for line in lines))
        return len(lines)

    def close(self, aggregates: SwarmAggregates) -> None:
        """Write what is left (:meth:`update` with ``final``) and close the TensorBoard log."""
        try:
            self.update(aggregates, final=True)
        finally:
            if self.tensorboard is not None:
                self.tensorboard.close()


def _api_row(line: dict[str, Any]) -> dict[str, Any]:
    """A round line as a row of ``/api/rounds`` (:meth:`SwarmAggregates.rounds`)."""
    return {
        "round": int(line["round"]),
        "samples": line.get("samples", 0),
        "loss": line.get("loss"),
        "peers": line.get("contributors", 0),
        "throughput": line.get("throughput", 0.0),
        "cohorts": line.get("cohorts", []),
        "first_seen": line.get("time"),
        "last_change": line.get("time"),
    }
