"""A leader whose group the lowered target makes full begins at once (real averagers on loopback)."""

from __future__ import annotations

import time

import torch
from hivemind.utils import get_dht_time

from hivemind_adapter.allreduce import VerifiedAverager
from hivemind_adapter.dht import start_dht, visible_maddrs
from tests.hivemind_adapter.averager_pair import LOOPBACK, PAIR_SETTINGS, step_all_at_once

GATHER = 30.0  # each step's wait for the whole group of three
JOINED = 5.0  # by then the two have met: two matchmaking periods and more


def test_a_pair_waiting_for_a_third_begins_once_the_target_drops_to_two():
    """A stage that learns a unit will not come (its peers reported the attempt, or left) lowers its
    target: hivemind checks for a full group only as a follower joins, so the pair formed only at the
    end of its gather, however long (a regroup in a cohort of four waited 57 s so)."""
    dhts = [start_dht(host_maddrs=LOOPBACK)]
    dhts.append(start_dht(host_maddrs=LOOPBACK, initial_peers=visible_maddrs(dhts[0])))
    settings = {**PAIR_SETTINGS, "target_group_size": 3}
    averagers: list[VerifiedAverager] = []
    try:
        for i, dht in enumerate(dhts):
            averagers.append(
                VerifiedAverager([torch.full((64,), float(i))], dht, prefix="lowered", **settings)
            )
        ends = get_dht_time() + GATHER
        formed: list[float] = [0.0, 0.0]

        def step(i: int, averager: VerifiedAverager) -> object:
            control = averager.step(
                timeout=GATHER + 10.0, allow_retries=False, scheduled_time=ends, wait=False
            )
            time.sleep(JOINED)
            averager.set_target_group_size(2)
            gathered = control.result(timeout=GATHER + 10.0)
            formed[i] = get_dht_time()
            return gathered

        outcomes = step_all_at_once(averagers, step, 2 * GATHER)
        assert all(isinstance(o, dict) and len(o) == 2 for o in outcomes), outcomes
        assert all(t < ends - 10.0 for t in formed), (formed, ends)  # not at the end of the gather
        for averager in averagers:
            with averager.get_tensors() as held:
                torch.testing.assert_close(held[0], torch.full((64,), 0.5))
    finally:
        for averager in averagers:
            averager.shutdown()
        for dht in reversed(dhts):
            dht.shutdown()
