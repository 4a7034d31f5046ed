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
    outcomes: list[object] = [None, None]
    peer_ids = [averager.peer_id.to_base58() for averager in averagers]

    def step(i: int) -> None:
        try:
            if take_step is not None:
                outcomes[i] = take_step(i, averagers[i], peer_ids)
            else:
                outcomes[i] = averagers[i].step(timeout=step_timeout, allow_retries=False)
        except Exception as e:  # an outcome some tests are about: a member whose all-reduce failed
            outcomes[i] = e

    try:
        threads = [threading.Thread(target=step, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=2 * step_timeout)
        assert not any(t.is_alive() for t in threads), "a step did not end within its bounds"
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
