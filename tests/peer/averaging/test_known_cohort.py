"""A cohort that meets as a known group: real averagers on loopback DHT nodes, the roll at the end of
their buffer as in a cohort averager. Members confirm their result among themselves; they get every
member's count and the sample-weighted mean (a robust centre, with robust averaging), and one member
can neither poison the mean (NaN; x1000, robust) nor write another's count."""

from __future__ import annotations

import hashlib
import math

import pytest
import torch

from hivemind_adapter.allreduce import VerifiedAverager
from hivemind_adapter.known_groups import known_group_id
from peer.averaging.known_cohort import KnownCohort, new_roll
from robust_aggregation.centered_clip import RobustConfig
from tests.hivemind_adapter.averager_group import (
    ALLREDUCE_TIMEOUT,
    ARRIVAL_TIMEOUT,
    step_known_group_repeatedly,
)
from tests.hivemind_adapter.averager_pair import step_pair


def _buffer(i: int) -> list[torch.Tensor]:
    return [torch.full((5,), float(i)), new_roll()]


def _confirm_pair(digests: list[str]) -> list[object]:
    def take_step(i, averager, peer_ids):
        members = tuple(sorted(peer_ids))
        return KnownCohort("run", "cohort-a", client_mode=False).confirm(
            averager, 7, members, peer_ids[i], digests[i], "state", allreduce_timeout=10.0
        )

    results, outcomes, _ = step_pair(VerifiedAverager, _buffer, 20.0, take_step=take_step, prefix="confirm")
    for i, held in enumerate(results):
        assert torch.equal(held[0], _buffer(i)[0])  # the round's result is not touched
    return outcomes


def test_members_holding_one_result_confirm_it():
    same = hashlib.sha256(b"the round's result").hexdigest()
    assert _confirm_pair([same, same]) == [True, True]


def test_members_whose_results_differ_leave_it_to_the_board():
    # digests that differ only in the fingerprint's top bits: 40 bits survive the float32 mean exactly
    first = "f" * 54 + "0123456789"
    second = "f" * 54 + "8123456789"
    assert _confirm_pair([first, second]) == [False, False]


def test_a_cohort_holding_a_barred_peer_meets_through_matchmaking():
    """A known group is the whole roster cohort: one holding a peer this peer barred (a lying
    reducer, say) goes to matchmaking, whose admission leaves that peer out."""
    cohort = ("QmAlice", "QmBob", "QmLiar")
    known = KnownCohort("run", "cohort-a", client_mode=False)
    assert known.members(cohort, 3, "QmAlice", live=None) == cohort
    assert known.members(cohort, 3, "QmAlice", live=None, barred={"QmLiar"}) is None
    assert known.members(cohort, 3, "QmAlice", live=None, barred={"QmSomeoneElse"}) == cohort


# ------------------------------------------------------------- robust known groups (inner steps)

SAMPLES = (16, 32, 48, 32)  # member i's samples; member 3 is the dishonest one


def _mean_gradient(i: int) -> torch.Tensor:
    """Member ``i``'s mean gradient: a shared signal plus its own noise (40,000 values: several parts)."""
    signal = torch.randn(40_000, generator=torch.Generator().manual_seed(11))
    return signal + 0.1 * torch.randn(40_000, generator=torch.Generator().manual_seed(100 + i))


def _known_group(take_step, robust: bool = True) -> tuple[list, list, list, list[str]]:
    """Four cohort averagers (the roll a slotted tail, as :class:`~peer.averaging.hierarchy.
    HierarchicalAverager` builds them; ``robust`` or plain) take one known-group step with
    ``take_step(i, averager, members)``; returns what each holds, each outcome, each
    ``last_outliers()`` and the peer ids."""
    history, peer_ids = step_known_group_repeatedly(
        4,
        1,
        lambda i: [_mean_gradient(i), new_roll()],
        lambda i: dict(robust=RobustConfig() if robust else None, slotted_tail=1),
        take_step=lambda i, averager, peer_ids: take_step(i, averager, tuple(sorted(peer_ids)), peer_ids[i]),
        prefix="robust-known" if robust else "plain-known",
        part_size_bytes=16 * 1024,
    )
    (results, outcomes, named) = history[0]
    return results, outcomes, named, peer_ids


def _average(i: int, averager, members, me: str, vector: torch.Tensor):
    with averager.get_tensors() as held:
        held[0].copy_(vector)
    return KnownCohort("run", "cohort-a", client_mode=False).average(
        averager, 7, members, me, SAMPLES[i], "state",
        arrival_timeout=ARRIVAL_TIMEOUT, allreduce_timeout=ALLREDUCE_TIMEOUT, weight=float(SAMPLES[i]),
    )  # fmt: skip


def _weighted_mean(indices) -> torch.Tensor:
    total = sum(SAMPLES[i] * _mean_gradient(i).double() for i in indices)
    return (total / sum(SAMPLES[i] for i in indices)).float()


@pytest.mark.parametrize("poison", ["x1000 robust", "nan plain"])
def test_a_known_group_counts_every_member_and_leaves_a_poisoned_mean_out(poison):
    """Plain reducers leave a part holding NaN out of their mean (hivemind_adapter.finite_reduce)."""
    bad = math.nan if poison.startswith("nan") else 1000.0
    results, outcomes, named, peer_ids = _known_group(
        lambda i, averager, members, me: _average(
            i, averager, members, me, _mean_gradient(i) * (bad if i == 3 else 1)
        ),
        robust=poison.endswith("robust"),
    )
    order = sorted(peer_ids)
    counts = [SAMPLES[peer_ids.index(p)] for p in order]  # every count, in the members' order
    assert outcomes == [counts] * 4, outcomes
    honest = _weighted_mean(range(3))
    for held in results[:3]:  # the sample-weighted mean of the honest three, bit for bit
        assert torch.allclose(held[0], honest, rtol=0, atol=1e-6), float((held[0] - honest).abs().max())
    assert len({held[0].numpy().tobytes() for held in results}) == 1
    assert named[:3] == [[peer_ids[3]]] * 3, named  # every reducer saw the poisoned mean


@pytest.mark.parametrize("robust", [True, False], ids=["robust", "plain"])
def test_a_member_cannot_write_another_members_count(robust):
    """The dishonest member writes its own count and a forged one in another member's slot: every
    member still reads that member's true count, and the roll's reducer names the forger, whose count
    it drops. The forger is the first member in the group's order: equal shares put the roll (the
    buffer's tail) with the last member, so the forgery always reaches an honest reducer."""

    def take_step(i, averager, members, me):
        if me != members[0]:
            return _average(i, averager, members, me, _mean_gradient(i))
        with averager.get_tensors() as held:
            held[0].copy_(_mean_gradient(i))
            held[1].zero_()
            held[1][0] = SAMPLES[i]
            held[1][1] = 10_000  # the next member's slot
        averager.step_in_known_group(
            known_group_id("run", "cohort-a", "7", "state", *members), members, weight=float(SAMPLES[i]),
            arrival_timeout=ARRIVAL_TIMEOUT, allreduce_timeout=ALLREDUCE_TIMEOUT,
        )  # fmt: skip
        return "stepped"

    results, outcomes, named, peer_ids = _known_group(take_step, robust)
    order = sorted(peer_ids)
    forger = order[0]
    want = [0 if p == forger else SAMPLES[peer_ids.index(p)] for p in order]
    honest = [i for i, p in enumerate(peer_ids) if p != forger]
    assert [outcomes[i] for i in honest] == [want] * 3, outcomes
    # one member reduces the roll (its one part): it alone saw the forgery
    assert sum(forger in named[i] for i in honest) == 1, named
