"""What a volunteer sees while `manta-peer join` runs.

On a terminal: one status line, redrawn in place a few times a second while the peer computes
(round, samples so far, samples/s, the swarm's progress towards the round's target) or waits for the
data shards it trains on (shards and bytes downloaded), and one summary
line per finished round (loss, cohort, peers, credits so far). Anywhere else (a log file, a pipe, a
service manager): nothing is redrawn, and each round is one plain log line, which is what tools and
tests parse.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


class ProgressDisplay:
    def __init__(self, stream: TextIO | None = None, interactive: bool | None = None):
        self.stream = stream or sys.stdout
        self.interactive = self.stream.isatty() if interactive is None else interactive
        self._last_draw = 0.0
        self._drawn = False

    def computing(self, round_index: int, samples: float, rate: float, swarm: float, target: int) -> None:
        """The live line while the round's mini-batches run (redrawn at most 4 times a second)."""
        if not self.interactive or time.monotonic() - self._last_draw < 0.25:
            return
        self._last_draw = time.monotonic()
        share = min(1.0, swarm / max(1, target))
        bar = "#" * int(share * 20)
        self._draw(
            f"round {round_index + 1}: computing  {int(samples)} samples  {rate:.1f} samples/s  "
            f"swarm [{bar:<20}] {int(swarm)}/{target}"
        )

    def downloading(
        self, what: str, shards_done: int, shards: int, bytes_done: int, bytes_total: int
    ) -> None:
        """The live line while the peer waits for the data shards it trains on (redrawn at most 4
        times a second on a terminal; elsewhere the caller logs a line now and then)."""
        if not self.interactive or time.monotonic() - self._last_draw < 0.25:
            return
        self._last_draw = time.monotonic()
        share = bytes_done / max(1, bytes_total)
        bar = "#" * int(share * 20)
        self._draw(
            f"{what}: downloading data [{bar:<20}] {shards_done}/{shards} shards  "
            f"{bytes_done / 1e6:.1f}/{bytes_total / 1e6:.1f} MB"
        )

    def averaging(self, round_index: int) -> None:
        if self.interactive:
            self._draw(f"round {round_index + 1}: averaging with the swarm ...")

    def round_done(self, report, peers: int, credits: int) -> None:
        """One persistent line per round (terminal only; elsewhere the log line says it)."""
        if not self.interactive:
            return
        status = "committed" if report.committed else f"aborted ({report.reason})"
        rate = report.samples / max(report.times.get("compute", 0.0), 1e-6)
        self._draw(
            f"round {report.round + 1} {status}: loss {report.loss:.4f}, {report.samples} samples at "
            f"{rate:.1f}/s, cohort {report.cohort}, {peers} peer(s), credits {credits:.3g} FLOPs"
        )
        self.stream.write("\n")
        self.stream.flush()
        self._drawn = False

    def _draw(self, line: str) -> None:
        self.stream.write("\r\x1b[2K" + line)  # carriage return, clear the line, redraw
        self.stream.flush()
        self._drawn = True

    def close(self) -> None:
        if self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = False
