"""A group of VerifiedAveragers on loopback DHT nodes that average once as a known group (no
matchmaking), each step bounded: what the tests of a group larger than a pair need."""

from __future__ import annotations

from collections.abc import Callable

import torch

from hivemind_adapter.allreduce import VerifiedAverager
from hivemind_adapter.dht import start_dht, visible_maddrs
from hivemind_adapter.group_keys import DeclarationSigner
from hivemind_adapter.known_groups import known_group_id
from tests.hivemind_adapter.averager_pair import LOOPBACK, PAIR_SETTINGS, step_all_at_once

ARRIVAL_TIMEOUT = 4.0  # below the sender timeout (PAIR_SETTINGS' next_chunk_timeout)
ALLREDUCE_TIMEOUT = 10.0


def step_known_group(
    size: int,
    tensors: Callable[[int], list[torch.Tensor]],
    averager_kwargs: Callable[[int], dict] = lambda i: {},
    averager_type: Callable[[int], type[VerifiedAverager]] = lambda i: VerifiedAverager,
    **settings,
) -> tuple[list[list[torch.Tensor]], list[object], list[list[str]], list[str]]:
    """Member ``i`` of ``size`` starts from ``tensors(i)`` with ``averager_kwargs(i)``; all step in one
    known group at once (member ``i`` an ``averager_type(i)``). Returns what each holds afterwards, each step's outcome (None, or the
    exception it raised), each member's ``last_outliers()``, and the members' base58 ids."""
    steps, peer_ids = step_known_group_repeatedly(
        size, 1, tensors, averager_kwargs, averager_type, **settings
    )
    results, outcomes, named = steps[0]
    return results, outcomes, named, peer_ids


def step_known_group_repeatedly(
    size: int,
    steps: int,
    tensors: Callable[[int], list[torch.Tensor]],
    averager_kwargs: Callable[[int], dict] = lambda i: {},
    averager_type: Callable[[int], type[VerifiedAverager]] = lambda i: VerifiedAverager,
    take_step: Callable[[int, VerifiedAverager, list[str]], object] | None = None,
    signer: Callable[[int, object], DeclarationSigner] | None = None,
    **settings,
) -> tuple[list[tuple[list[list[torch.Tensor]], list[object], list[list[str]]]], list[str]]:
    """:func:`step_known_group` ``steps`` times with the same averagers (what they remember across
    all-reduces carries over), each step from ``tensors(i)`` again; per step (what each holds, each
    outcome, each ``last_outliers()``), and the members' base58 ids. ``take_step(i, averager,
    peer_ids)``, if given, takes member ``i``'s step instead (its return value is the outcome).
    ``signer(i, dht)``, if given, is member ``i``'s declaration signer (it needs the member's DHT)."""
    dhts = [start_dht(host_maddrs=LOOPBACK)]
    averagers: list[VerifiedAverager] = []
    try:
        for _ in range(size - 1):
            dhts.append(start_dht(host_maddrs=LOOPBACK, initial_peers=visible_maddrs(dhts[0])))
        common = {**PAIR_SETTINGS, **settings}
        for i, dht in enumerate(dhts):
            # copies: hivemind shares an averager's tensors in place, and every step writes them
            # (the caller's tensors would silently become the result it compares against)
            held = [t.clone() for t in tensors(i)]
            signed = {} if signer is None else {"declarations": signer(i, dht)}
            averagers.append(averager_type(i)(held, dht, **common, **averager_kwargs(i), **signed))
        peer_ids = [averager.peer_id.to_base58() for averager in averagers]
        history = []
        for step_index in range(steps):
            group = known_group_id(f"robust-test-{step_index}", *sorted(peer_ids))
            for i, averager in enumerate(averagers):
                with averager.get_tensors() as held:
                    for dst, src in zip(held, tensors(i)):
                        dst.copy_(src)

            def step(i: int, averager: VerifiedAverager, group: str = group) -> object:
                if take_step is not None:
                    return take_step(i, averager, peer_ids)
                return averager.step_in_known_group(
                    group,
                    sorted(peer_ids),
                    weight=1.0,
                    arrival_timeout=ARRIVAL_TIMEOUT,
                    allreduce_timeout=ALLREDUCE_TIMEOUT,
                )

            outcomes = step_all_at_once(averagers, step, ARRIVAL_TIMEOUT + ALLREDUCE_TIMEOUT + 10)
            results = []
            for averager in averagers:
                with averager.get_tensors() as held:
                    results.append([t.clone() for t in held])
            history.append((results, outcomes, [averager.last_outliers() for averager in averagers]))
        return history, peer_ids
    finally:
        for averager in averagers:
            averager.shutdown()
        for dht in reversed(dhts):
            dht.shutdown()
