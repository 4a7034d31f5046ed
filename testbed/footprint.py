"""What a peer costs its host while a swarm runs: its processes (the agent and every descendant:
workers, DHT, averagers, ``p2pd``, the reaper) and their memory as proportional set size (PSS: each
page shared by k processes counts 1/k), sampled every :data:`SAMPLE_EVERY` seconds."""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import psutil

SAMPLE_EVERY = 15.0  # seconds; reading every process's smaps_rollup costs a few ms each


@dataclass(frozen=True)
class Footprint:
    processes: int
    pss_mib: float


def footprint(pid: int) -> Footprint | None:
    """The process ``pid`` and its descendants now; None if it is gone."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return None
    pss_kib = 0
    for proc in procs:
        try:
            rollup = Path(f"/proc/{proc.pid}/smaps_rollup").read_text()
        except OSError:  # exited meanwhile
            continue
        pss_kib += next((int(line.split()[1]) for line in rollup.splitlines() if line.startswith("Pss:")), 0)
    return Footprint(len(procs), pss_kib / 1024)


class FootprintSampler:
    """Samples each running peer's :func:`footprint` when :meth:`tick` finds a sample due."""

    def __init__(self, every: float = SAMPLE_EVERY):
        self.every = every
        self.samples: dict[str, list[Footprint]] = {}
        self._next = time.monotonic() + every  # the first sample after start-up

    def tick(self, pids: Mapping[str, int]) -> None:
        if time.monotonic() < self._next:
            return
        self._next = time.monotonic() + self.every
        for name, pid in pids.items():
            if (got := footprint(pid)) is not None:
                self.samples.setdefault(name, []).append(got)

    def summary(self) -> dict[str, dict[str, float]]:
        """Per peer: the most processes seen at once and the median PSS in MiB."""
        return {
            name: {
                "processes": max(s.processes for s in samples),
                "pss_mib": round(statistics.median(s.pss_mib for s in samples), 1),
            }
            for name, samples in self.samples.items()
            if samples
        }


def footprint_line(per_peer: Mapping[str, Mapping[str, float]]) -> str:
    """One line for the run's summary: processes and PSS per peer, over the peers sampled."""
    if not per_peer:
        return "per peer: not sampled (the run ended within the first sample's delay)"
    processes = sorted(int(v["processes"]) for v in per_peer.values())
    pss = sorted(v["pss_mib"] for v in per_peer.values())
    spread = f"{processes[0]}" if processes[0] == processes[-1] else f"{processes[0]}–{processes[-1]}"
    return (
        f"per peer: {spread} processes, memory (PSS) median {statistics.median(pss):.0f} MiB "
        f"(largest {pss[-1]:.0f} MiB)"
    )
