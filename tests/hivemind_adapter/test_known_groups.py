"""A known group's all-reduce (no matchmaking) between two real averagers on loopback DHT nodes."""

from __future__ import annotations

import time

import pytest
import torch

from hivemind_adapter.allreduce import VerifiedAverager
from hivemind_adapter.known_groups import known_group_id
from tests.hivemind_adapter.averager_pair import PAIR_SETTINGS, step_pair


def _start(i: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(100 + i)
    return [torch.randn(3000, generator=generator), torch.randn(7, 5, generator=generator)]


def test_members_that_know_each_other_average_exactly_without_matchmaking():
    group = known_group_id("task", "attempt 3", "state abc")

    def take_step(i, averager, peer_ids):
        if i == 1:
            time.sleep(1.5)  # a member that finished computing later: the first holds its parts
        started = time.perf_counter()
        averager.step_in_known_group(
            group, sorted(peer_ids), weight=1.0, arrival_timeout=4.0, allreduce_timeout=10.0
        )
        return time.perf_counter() - started

    results, outcomes, wire = step_pair(VerifiedAverager, _start, 20.0, take_step=take_step, prefix="known")
    assert all(isinstance(o, float) for o in outcomes), outcomes
    expected = [(a + b) / 2 for a, b in zip(_start(0), _start(1))]
    for held in results:
        for got, want in zip(held, expected):
            assert torch.allclose(got, want, atol=1e-6)
    assert all(torch.equal(a, b) for a, b in zip(*results))  # bit for bit on both members
    assert outcomes[1] < 1.5  # the late member found its partner waiting: no matchmaking period
    assert all(sent > 0 and received > 0 for sent, received in wire)


def test_a_member_that_never_comes_fails_the_step_within_its_bound_and_leaves_the_tensors():
    group = known_group_id("task", "attempt 4", "state abc")

    def take_step(i, averager, peer_ids):
        if i == 1:
            return "stayed away"
        started = time.perf_counter()
        with pytest.raises(TimeoutError):
            averager.step_in_known_group(
                group, sorted(peer_ids), weight=1.0, arrival_timeout=3.0, allreduce_timeout=10.0
            )
        return time.perf_counter() - started

    results, outcomes, _ = step_pair(VerifiedAverager, _start, 20.0, take_step=take_step, prefix="known")
    assert outcomes[0] < 3.0 + 2.0, outcomes  # the arrival bound, not the all-reduce's
    assert all(torch.equal(a, b) for a, b in zip(results[0], _start(0)))  # untouched


def test_members_further_apart_than_the_sender_timeout_still_average_exactly():
    # hivemind drops a sender silent for its sender timeout (5 s here). The members tell each other
    # they arrived before any sends a part, so one 7 s late still meets its partner.
    group = known_group_id("task", "attempt 7", "state abc")
    late = PAIR_SETTINGS["next_chunk_timeout"] + 2.0

    def take_step(i, averager, peer_ids):
        if i == 1:
            time.sleep(late)
        averager.step_in_known_group(
            group, sorted(peer_ids), weight=1.0, arrival_timeout=late + 5.0, allreduce_timeout=10.0
        )
        return "ok"

    results, outcomes, _ = step_pair(VerifiedAverager, _start, 40.0, take_step=take_step, prefix="known")
    assert outcomes == ["ok", "ok"], outcomes
    expected = [(a + b) / 2 for a, b in zip(_start(0), _start(1))]
    for held in results:
        assert all(torch.allclose(got, want, atol=1e-6) for got, want in zip(held, expected))


def test_a_member_arriving_after_its_partner_gave_up_gives_up_at_once():
    group = known_group_id("task", "attempt 8", "state abc")

    def take_step(i, averager, peer_ids):
        if i == 1:
            time.sleep(4.0)  # its partner waits 2 s
        started = time.perf_counter()
        with pytest.raises(TimeoutError):
            averager.step_in_known_group(
                group, sorted(peer_ids), weight=1.0, arrival_timeout=2.0 if i == 0 else 20.0,
                allreduce_timeout=10.0,
            )  # fmt: skip
        return time.perf_counter() - started

    results, outcomes, _ = step_pair(VerifiedAverager, _start, 40.0, take_step=take_step, prefix="known")
    assert outcomes[1] < 5.0, outcomes  # told "cancelled", not its own 20 s bound
    for i in range(2):
        assert all(torch.equal(a, b) for a, b in zip(results[i], _start(i)))


def test_members_that_disagree_on_the_group_never_mix():
    def take_step(i, averager, peer_ids):
        group = known_group_id("task", "attempt 5", f"state {i}")  # each started from another state
        with pytest.raises(TimeoutError):
            averager.step_in_known_group(
                group, sorted(peer_ids), weight=1.0, arrival_timeout=3.0, allreduce_timeout=10.0
            )
        return "failed"

    results, outcomes, _ = step_pair(VerifiedAverager, _start, 20.0, take_step=take_step, prefix="known")
    assert outcomes == ["failed", "failed"]
    for i in range(2):
        assert all(torch.equal(a, b) for a, b in zip(results[i], _start(i)))


def test_a_known_group_can_average_only_its_last_tensor():
    """The cohort's confirmation after an inner step: a few bytes among the same members, the rest of
    the buffer (the round's result) left as it is."""
    group = known_group_id("task", "attempt 6", "state abc", "confirm")

    def take_step(i, averager, peer_ids):
        averager.step_in_known_group(
            group, sorted(peer_ids), weight=1.0, arrival_timeout=4.0, allreduce_timeout=10.0, last=1
        )
        return "ok"

    results, outcomes, wire = step_pair(VerifiedAverager, _start, 20.0, take_step=take_step, prefix="known")
    assert outcomes == ["ok", "ok"], outcomes
    for i in range(2):
        assert torch.equal(results[i][0], _start(i)[0])  # not averaged
        assert torch.allclose(results[i][1], (_start(0)[1] + _start(1)[1]) / 2, atol=1e-6)
    assert torch.equal(results[0][1], results[1][1])
    assert all(0 < sent < 7 * 5 * 4 * 2 for sent, _ in wire)  # the last tensor's bytes, not the first's
