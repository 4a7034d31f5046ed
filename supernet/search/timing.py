"""Wall-clock timing for the latency model: a device, a thread count, warm-up, then a median.

Latency is measured at batch size 1 (one image, or one stereo pair), the deployment case, with
``torch.inference_mode``. The median of the repeats, not the mean, because a shared machine
produces occasional slow outliers that say nothing about the model. On CUDA every timed call is
followed by a synchronisation, so the time covers the kernels and not just their launch.
"""

from __future__ import annotations

import platform
import statistics
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

import torch

__all__ = [
    "DEVICES",
    "DeviceError",
    "device_name",
    "example_inputs",
    "interleaved_median_ms",
    "median_ms",
    "resolve_device",
    "torch_threads",
]

DEVICES = ("cpu", "cuda")


class DeviceError(ValueError):
    """An unknown or unavailable latency device (one line saying which)."""


def resolve_device(name: str) -> torch.device:
    """``"cpu"`` or ``"cuda"`` as a ``torch.device``; ``DeviceError`` if unknown or not present here."""
    if name not in DEVICES:
        raise DeviceError(f"--device: unknown device {name!r} (choose {' or '.join(DEVICES)})")
    if name == "cuda" and not torch.cuda.is_available():
        raise DeviceError("--device cuda: no CUDA device is available on this machine")
    return torch.device(name)


def device_name(device: torch.device) -> str:
    """A human-readable name of the hardware behind ``device`` (recorded in latency tables)."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass

    return platform.processor() or platform.machine()


@contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """Run the block with ``threads`` intra-op threads, restoring the previous setting after."""
    before = torch.get_num_threads()
    torch.set_num_threads(int(threads))
    try:
        yield
    finally:
        torch.set_num_threads(before)


def median_ms(fn: Callable[[], object], device: torch.device, warmup: int, repeats: int) -> float:
    """Median wall time of ``fn()`` in milliseconds over ``repeats`` calls after ``warmup`` calls."""
    return interleaved_median_ms({"fn": fn}, device, warmup, repeats)["fn"]


def interleaved_median_ms(
    fns: Mapping[str, Callable[[], object]], device: torch.device, warmup: int, repeats: int, rounds: int = 5
) -> dict[str, float]:
    """Median wall time (ms) of each function over ``repeats`` calls, the calls spread over ``rounds``
    passes through all functions.

    Interleaving is what makes a table of many entries trustworthy on a shared machine: a burst of
    someone else's load lands on a slice of every entry's samples, where timing the entries one after
    the other would inflate the few entries measured during the burst (and the first ones, measured
    while the CPU and allocator warm up). Each function gets ``warmup`` untimed calls first.
    """
    if repeats < 1:
        raise ValueError(f"repeats: need at least 1, got {repeats}")
    rounds = max(1, min(rounds, repeats))
    cuda = device.type == "cuda"
    samples: dict[str, list[float]] = {key: [] for key in fns}
    with torch.inference_mode():
        for fn in fns.values():
            for _ in range(max(0, warmup)):
                fn()
        for r in range(rounds):
            per_round = repeats // rounds + (1 if r < repeats % rounds else 0)
            for key, fn in fns.items():
                if cuda:
                    torch.cuda.synchronize(device)
                for _ in range(per_round):
                    start = time.perf_counter()
                    fn()
                    if cuda:
                        torch.cuda.synchronize(device)
                    samples[key].append(time.perf_counter() - start)
    return {key: statistics.median(times) * 1e3 for key, times in samples.items()}


def example_inputs(
    family: str, input_size: tuple[int, ...], device: torch.device
) -> tuple[torch.Tensor, ...]:
    """One sample of the right shape: ``(image,)`` for classification, ``(left, right)`` for stereo.

    ``input_size`` is :attr:`supernet.workload.Workload.input_size` ((C, H, W) or (H, W)). Values are
    random but fixed (a private generator), so repeated measurements see the same data.
    """
    generator = torch.Generator().manual_seed(0)
    if family == "stereo":
        height, width = input_size[-2:]
        pair = torch.rand(2, 1, 3, height, width, generator=generator)
        return pair[0].to(device), pair[1].to(device)
    return (torch.rand(1, *input_size, generator=generator).to(device),)
