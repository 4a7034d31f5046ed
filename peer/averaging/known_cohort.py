"""A cohort averages in a group its members already know, without matchmaking.

Every member read the same roster, so each knows who the others are. Meeting them through
hivemind's matchmaking takes DHT round trips (across the wide area, for an outer task's inner
steps) and, under load, lets a member that declared late miss its cohort's group. Here the members
go straight to the all-reduce (:mod:`hivemind_adapter.known_groups`), in a group whose id says the
task, the attempt, the start state and the members: peers that disagree on any of them never mix.
An outer task's inner step does so at once; a round does so once its cohort's last stage gathered
every roster peer of the cohort, each a server (:meth:`peer.averaging.hierarchy.HierarchicalAverager.average`).

Matchmaking also gathered each member's sample count, which the final vector and the receipts need.
A known group carries them in the vector itself: the cohort averager's buffer ends with a float64
"roll" of :data:`ROLL_SLOTS`, where each member writes its count in its own slot and zeros elsewhere.
The all-reduce's mean of the roll, times the group's size, is every member's count, exactly (each
slot has one non-zero term; its quotient and product round back to the integer: hivemind's reducer
averages in float32, where counts below 2^20 survive both).

The members send their mean gradients weighted by their samples, as in a matchmade group (with
robust averaging the reducers take a robust centre of them); the roll is a slotted tensor of the
averager (:func:`~robust_aggregation.centered_clip.slotted_centre`): each slot's value is its owner's
whatever the weights, so a member cannot write another's count, and the counts come back as from a
plain mean.

When it fails (a member late by more than the bound, asleep, dead, or unreachable), nothing was
written, and the stage falls back to matchmaking. After a failure the next few attempts go to
matchmaking directly, so a member that cannot be reached costs the bound once, not every step.

The commit: every member posts its result on the commit board as always, and then the group meets
once more over the roll alone (:meth:`KnownCohort.confirm`, a few hundred bytes over the cohort's
links): each member says "ok" and a fingerprint of the result it computed (40 bits of its
digest). A member that receives every member's "ok" with its own fingerprint knows that the whole
cohort (the roster that commits an inner step) holds its result, and commits without waiting for
the board's reports to cross the wide area. A member whose confirmation fails waits for the board;
the others' reports are on their way there.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence

import torch

from hivemind_adapter.allreduce import VerifiedAverager
from hivemind_adapter.known_groups import known_group_id
from peer.averaging.stage import RoundAborted

logger = logging.getLogger(__name__)

ROLL_SLOTS = 64  # the largest cohort that averages in a known group (a larger one uses matchmaking)
SKIP_AFTER_FAILURE = 2  # attempts that go straight to matchmaking after a known group failed
CONFIRM_ARRIVAL_SECONDS = 2.0  # members confirm right after the all-reduce they all completed
# How far apart a cohort's members may arrive, in sender timeouts: at 32 thin peers on 2 cores a
# cohort's members began a round up to 15 s apart (their reads between rounds took that long).
ARRIVAL_SENDER_TIMEOUTS = 2.0
# A result's fingerprint: two 20-bit pieces of its digest. hivemind's reducer averages in float32
# whatever the roll's dtype (a float32 keeps 24 bits of a value), and
# a 20-bit integer survives float32's mean and the product by the group's size exactly.
FINGERPRINT_PIECES = 2
FINGERPRINT_BITS = 20


def new_roll() -> torch.Tensor:
    """The sample-count slots appended to a cohort averager's buffer."""
    return torch.zeros(ROLL_SLOTS, dtype=torch.float64)


class KnownCohort:
    """Decides when a cohort's stage may use a known group, and takes that stage."""

    def __init__(self, run_id: str, cohort: str, client_mode: bool):
        self.run_id, self.cohort, self.client_mode = run_id, cohort, client_mode
        self._skip = 0  # attempts left that go straight to matchmaking
        self.steps_taken = 0  # stages averaged in a known group (for the logs and tests)
        self.failures = 0  # known groups that did not complete (then matchmaking took over)

    def members(
        self,
        roster_cohort: Sequence[str],
        size: int,
        peer_id: str,
        live: Collection[str] | None,
        barred: Collection[str] = (),
    ) -> tuple[str, ...] | None:
        """The known group's members in the order every member uses, or None: matchmaking instead.
        A client-mode peer cannot reduce a share (it accepts no connections): not in a known group.
        Neither is one whose roster peers did not all show life in the previous attempt (``live``),
        nor one whose cohort holds a peer it barred (``barred``: caught sending what it cannot have
        computed honestly): a known group is the whole roster cohort, and matchmaking's admission
        leaves the barred peer out."""
        peers = tuple(sorted(roster_cohort))
        if self.client_mode or len(peers) != size or peer_id not in peers or not 1 < len(peers) <= ROLL_SLOTS:
            return None
        if live is not None and not set(peers) <= set(live):
            return None
        if set(peers) & set(barred):
            return None
        if self._skip > 0:
            self._skip -= 1
            return None
        return peers

    def average(
        self,
        averager: VerifiedAverager,
        attempt: int,
        members: tuple[str, ...],
        peer_id: str,
        samples: int,
        state_digest: str,
        *,
        arrival_timeout: float,
        allreduce_timeout: float,
        weight: float = 1.0,
    ) -> list[int] | None:
        """Average the averager's buffer (its last tensor the roll) with ``members``, who must all
        arrive within ``arrival_timeout`` (see :meth:`~hivemind_adapter.known_groups.KnownGroupSteps.
        step_in_known_group`), this member's vector counting ``weight`` (its samples: the buffer
        holds its mean); returns every member's sample count in ``members``' order, or None if the
        group did not complete (the buffer is then untouched but for this peer's roll slot)."""
        with averager.get_tensors() as buf:
            roll = buf[-1]
            roll.zero_()
            roll[members.index(peer_id)] = float(samples)
        group_id = known_group_id(self.run_id, self.cohort, str(attempt), state_digest, *members)
        try:
            averager.step_in_known_group(
                group_id,
                members,
                weight=weight,
                arrival_timeout=arrival_timeout,
                allreduce_timeout=allreduce_timeout,
            )
        except Exception as e:  # hivemind reports a broken all-reduce with many exception types
            self._skip = SKIP_AFTER_FAILURE
            self.failures += 1
            logger.info(
                f"attempt {attempt}: the cohort's known group failed ({type(e).__name__}: {e}); matchmaking"
            )
            return None
        with averager.get_tensors() as buf:
            counts = [round(float(v) * len(members)) for v in buf[-1][: len(members)]]
        if counts[members.index(peer_id)] != samples:  # cannot happen with an exact all-reduce
            self._skip = SKIP_AFTER_FAILURE
            raise RoundAborted("the known group's roll lost this peer's sample count")
        self.steps_taken += 1
        return counts

    def confirm(
        self,
        averager: VerifiedAverager,
        attempt: int,
        members: tuple[str, ...],
        peer_id: str,
        result_digest: str,
        state_digest: str,
        allreduce_timeout: float,
    ) -> bool:
        """After the known group's all-reduce: whether every member computed ``result_digest`` (the
        roll's first slots say "ok", the next ones each member's fingerprint of its result). False
        if the confirmation did not complete here: the caller waits for the board instead."""
        n, me = len(members), members.index(peer_id)
        if (1 + FINGERPRINT_PIECES) * n > ROLL_SLOTS:
            return False
        whole = int(result_digest, 16)
        mine = [
            (whole >> (FINGERPRINT_BITS * k)) & ((1 << FINGERPRINT_BITS) - 1)
            for k in range(FINGERPRINT_PIECES)
        ]
        with averager.get_tensors() as buf:
            roll = buf[-1]
            roll.zero_()
            roll[me] = 1.0
            for k, piece in enumerate(mine):
                roll[(1 + k) * n + me] = float(piece)
        group_id = known_group_id(self.run_id, self.cohort, str(attempt), state_digest, "confirm", *members)
        try:
            averager.step_in_known_group(
                group_id, members, weight=1.0, arrival_timeout=CONFIRM_ARRIVAL_SECONDS,
                allreduce_timeout=allreduce_timeout, last=1,
            )  # fmt: skip
        except Exception as e:  # the board decides instead
            logger.info(
                f"attempt {attempt}: the cohort's confirmation failed ({type(e).__name__}: {e}); the board decides"
            )
            return False
        with averager.get_tensors() as buf:
            values = [round(float(v) * n) for v in buf[-1][: (1 + FINGERPRINT_PIECES) * n]]
        pieces = [values[(1 + k) * n : (2 + k) * n] for k in range(FINGERPRINT_PIECES)]
        if values[:n] != [1] * n or any(p != [mine[k]] * n for k, p in enumerate(pieces)):
            logger.warning(
                f"attempt {attempt}: the cohort's members computed different results; the board decides"
            )
            return False
        return True
