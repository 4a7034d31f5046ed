"""Which devices this peer lends: `--gpus all|none|0,2`, and what they are.

`all` means every visible CUDA device, one worker process each; with none visible the peer says so and
runs one CPU worker. `none` forces the CPU (and ``cpu_workers`` > 1 runs several CPU workers, which is
how the multi-worker path is exercised on machines without GPUs).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from dataclasses import dataclass

import psutil

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkerDevice:
    kind: str  # "cuda" or "cpu"
    index: int  # CUDA ordinal, or the CPU worker's number
    name: str
    memory_mb: int

    @property
    def torch_device(self) -> str:
        return f"cuda:{self.index}" if self.kind == "cuda" else "cpu"


def parse_gpus(spec: str) -> list[int] | str:
    """``"all"``/``"none"`` or a comma list of CUDA ordinals; ValueError naming the option otherwise."""
    spec = spec.strip().lower()
    if spec in ("all", "none"):
        return spec
    try:
        ordinals = [int(part) for part in spec.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"--gpus must be all, none or a list like 0,2; got {spec!r}") from None
    if not ordinals or any(o < 0 for o in ordinals) or len(set(ordinals)) != len(ordinals):
        raise ValueError(f"--gpus must list distinct non-negative GPU numbers; got {spec!r}")
    return ordinals


def discover_devices(gpus: str, cpu_workers: int = 1) -> list[WorkerDevice]:
    """The worker devices for ``--gpus``; the CPU fallback is logged, unknown ordinals are an error."""
    wanted = parse_gpus(gpus)
    visible = _cuda_devices() if wanted != "none" else []
    if wanted == "all":
        if visible:
            return visible
        logger.info("no GPU is visible; running %d CPU worker(s)", cpu_workers)
    elif isinstance(wanted, list):
        by_index = {d.index: d for d in visible}
        missing = [o for o in wanted if o not in by_index]
        if missing:
            raise ValueError(f"--gpus asks for GPU(s) {missing}, but {len(visible)} GPU(s) are visible")
        return [by_index[o] for o in wanted]
    memory = _memory_mb()
    return [WorkerDevice("cpu", i, f"cpu ({os.cpu_count()} cores)", memory) for i in range(cpu_workers)]


PROBE_TIMEOUT = 120.0  # seconds for the child that lists the GPUs (driver start-up can be slow)


def _cuda_devices() -> list[WorkerDevice]:
    """The visible CUDA devices, listed by a child process. ``torch.cuda.get_device_properties``
    creates a CUDA context in the process that calls it, and the agent later forks hivemind's
    processes, which must not inherit one: so the agent itself never touches ``torch.cuda``."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", "from peer.devices import print_cuda_devices; print_cuda_devices()"],
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT,
        )
        if done.returncode != 0:
            raise RuntimeError(done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "no output")
        return [WorkerDevice(**d) for d in json.loads(done.stdout.strip().splitlines()[-1])]
    except Exception as e:  # a broken driver must not stop a volunteer: the CPU remains
        logger.warning(f"could not list GPUs ({type(e).__name__}: {e}); treating none as visible")
        return []


def print_cuda_devices() -> None:
    """Print the visible CUDA devices as JSON (run in the child that :func:`_cuda_devices` starts)."""
    import torch  # here only: this function runs in a throw-away child process

    found = []
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        found.append(dict(kind="cuda", index=i, name=props.name, memory_mb=int(props.total_memory // 2**20)))
    print(json.dumps(found))


def _memory_mb() -> int:
    try:
        return int(psutil.virtual_memory().total // 2**20)
    except Exception:
        return 0
