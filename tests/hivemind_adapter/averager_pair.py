"""Two VerifiedAverager-like averagers on two loopback DHT nodes, stepping together (the tests that
check what one all-reduce between two members leaves in each)."""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch

from hivemind_adapter.allreduce import VerifiedAverager
from hivemind_adapter.dht import start_dht, visible_maddrs

LOOPBACK = ["/ip4/127.0.0.1/tcp/0"]
PAIR_SETTINGS = dict(
    target_group_size=2, min_group_size=2, min_matchmaking_time=2.0, request_timeout=1.0,
    next_chunk_timeout=5.0, allreduce_timeout=60.0, part_size_bytes=64 * 1024, start=True,
)  # fmt: skip


def step_pair(
    averager_type: type[VerifiedAverager],
    tensors: Callable[[int], list[torch.Tensor]],
    step_timeout: float,
    take_step: Callable[[int, VerifiedAverager, list[str]], object] | None = None,
    **settings,
) -> tuple[list[list[torch.Tensor]], list[object], list[tuple[int, int]]]:
    """Member ``i`` starts from ``tensors(i)``; both step at once (bounded). Returns what each holds
    afterwards, each step's outcome (its gathered metadata or the exception it raised), and each
    averager's (sent, received) payload bytes. ``take_step(i, averager, peer_ids)`` takes member
    ``i``'s step instead of a matchmade one (``peer_ids``: both members, base58)."""
    first_dht = start_dht(host_maddrs=LOOPBACK)
    second_dht = start_dht(host_maddrs=LOOPBACK, initial_peers=visible_maddrs(first_dht))
    common = {**PAIR_SETTINGS, **settings}
    averagers = [
        averager_type(tensors(0), first_dht, **common),
        averager_type(tensors(1), second_dht, **common),
    ]
    peer_ids = [averager.peer_id.to_base58() for averager in averagers]

    def step(i: int, averager: VerifiedAverager) -> object:
        if take_step is not None:
            return take_step(i, averager, peer_ids)
        return averager.step(timeout=step_timeout, allow_retries=False)

    try:
        outcomes = step_all_at_once(averagers, step, 2 * step_timeout)
        results = []
        for averager in averagers:
            with averager.get_tensors() as held:
                results.append([t.clone() for t in held])
        return results, outcomes, [averager.wire_bytes() for averager in averagers]
    finally:
        for averager in averagers:
            averager.shutdown()
        second_dht.shutdown()
        first_dht.shutdown()


def step_all_at_once(
    averagers: list[VerifiedAverager], step: Callable[[int, VerifiedAverager], object], bound: float
) -> list[object]:
    """``step(i, averager)`` for every averager at once, each in its own thread; returns each one's
    outcome (what it returned, or the exception it raised: a failed all-reduce is what some tests
    are about). Fails the test if any step outlives ``bound`` seconds."""
    outcomes: list[object] = [None] * len(averagers)

    def run(i: int) -> None:
        try:
            outcomes[i] = step(i, averagers[i])
        except Exception as e:  # the outcome under test
            outcomes[i] = e

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(averagers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=bound)
    assert not any(t.is_alive() for t in threads), "a step did not end within its bounds"
    return outcomes
