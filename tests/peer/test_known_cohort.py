"""A cohort that met as a known group confirms its result among its members: real averagers on
loopback DHT nodes, the roll at the end of their buffer as in a cohort averager."""

from __future__ import annotations

import hashlib

import torch

from hivemind_adapter.allreduce import VerifiedAverager
from peer.known_cohort import KnownCohort, new_roll
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
