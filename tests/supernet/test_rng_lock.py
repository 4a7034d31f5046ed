"""Building a supernet in one thread must not disturb an exact random sequence replayed in another.

``build_supernet`` seeds torch's global generator inside ``fork_rng`` and restores it afterwards: a
thread drawing meanwhile gets the build's draws, then its own earlier ones again. The aggregator's
spot audits replay a peer's augmentation draws while its checkpoint writer builds supernets, so
``Workload.build`` holds :data:`supernet.rng.TORCH_RNG_LOCK` (found when an honest receipt was revoked).
"""

from __future__ import annotations

import threading
import time

import torch

from supernet.rng import TORCH_RNG_LOCK
from supernet.workload import workload_for


def _replay(builder_started: threading.Event, seconds: float) -> torch.Tensor:
    """Draws for ``seconds`` (as an audit does while it replays mini-batches) after the build began."""
    with TORCH_RNG_LOCK:
        torch.manual_seed(1234)
        draws = [torch.rand(1)]
        builder_started.set()
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:  # without the lock, the other thread's build runs in here
            draws.append(torch.rand(1))
            time.sleep(0.001)
        return torch.cat(draws)


def test_a_build_in_another_thread_waits_for_a_replay_holding_the_lock():
    workload = workload_for("digits", dict(width_mult=0.25, head_channels=64))
    t0 = time.perf_counter()
    workload.build()
    build_seconds = time.perf_counter() - t0

    started = threading.Event()
    built = []
    builder = threading.Thread(target=lambda: (started.wait(), built.append(workload.build())))
    builder.start()
    got = _replay(started, seconds=3 * build_seconds + 0.2)
    builder.join(timeout=120)

    assert built, "the build never ran"
    torch.manual_seed(1234)
    assert torch.equal(got, torch.rand(len(got)))
