"""One torch thread for the supernet tests: on a shared 2-core machine, torch's default of one thread
per core makes small convolutions many times slower as soon as anything else runs. And a thread that
keeps re-seeding torch's global generator, for tests of computations that must not depend on it."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def single_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@contextmanager
def another_thread_reseeding_the_global_generator() -> Iterator[list[int]]:
    """A thread that seeds torch's global generator and draws from it until the block ends (as any
    library code in another thread of the aggregator may); yields its round counter."""
    stop, rounds = threading.Event(), [0]

    def churn() -> None:
        while not stop.is_set():
            torch.manual_seed(rounds[0])
            torch.rand(64)
            rounds[0] += 1

    thread = threading.Thread(target=churn, daemon=True)
    thread.start()
    try:
        yield rounds
    finally:
        stop.set()
        thread.join(timeout=60)
    assert rounds[0] > 0, "the other thread never ran"
