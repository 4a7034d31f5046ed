"""Groups of three confirm the result they shared before anyone goes on: :class:`PartnerChecks`."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from hivemind_adapter.allreduce import VerifiedAverager
from peer.commit.committer import RoundCommitter
from peer.commit.report import CommitReport
from peer.guard.peer_guard import PeerGuard
from protocol.averaging_group import stage_check_token
from supernet.state import digest

logger = logging.getLogger(__name__)


class CheckFailed(Exception):
    """A group of three's partners did not confirm its result; the message says why."""


class PartnerChecks:
    """After a robust all-reduce of exactly three, this peer and both partners post the token of the
    result each received and checked, and each waits for the other two's (the marker carries this
    attempt's proofs and refusals too). Groups of four or more hold a hidden lie by point 6 of the
    reducer proof; pairs are not covered (docs/security.md)."""

    def __init__(self, run_id: str, guard: PeerGuard, committer: RoundCommitter, robust: bool):
        self.run_id, self.guard, self.committer, self.robust = run_id, guard, committer, robust

    def check(
        self, attempt: int, stage: str, peers: Sequence[str], averager: VerifiedAverager, bound: float
    ) -> None:
        """Confirm the all-reduce ``stage`` of ``attempt`` that left ``averager``'s buffer with
        ``peers``; nothing to do unless robust and a group of three with this peer. Waits at most
        ``bound`` plus the commit wait. Raises :class:`CheckFailed` if the partners do not confirm."""
        me = self.guard.peer_id
        if not self.robust or len(set(peers)) != 3 or me not in peers:
            return
        t0 = time.perf_counter()
        with averager.get_tensors() as buf:
            received = digest(list(buf))
        token = stage_check_token(self.run_id, attempt, stage, peers, received)
        self.guard.evidence.checked.append(token)
        self.post_marker(attempt)
        partners = sorted(set(peers) - {me})
        checked = self.committer.await_partners(attempt, token, partners, bound, self.guard.public_keys())
        self.guard.evidence.check_seconds += time.perf_counter() - t0
        if checked.equivocation is not None:
            self.guard.convict(attempt, checked.equivocation)
        if not checked.confirmed:
            raise CheckFailed(f"{stage} group of three not confirmed: {checked.reason}")

    def post_marker(self, attempt: int, *, taken: bool = False) -> None:
        """Post this peer's marker for ``attempt``: the groups of three it checked, the proof
        attestations it accepted and the reducers it refused, so far (``taken``: the caller collected
        them from the averagers just now)."""
        if not taken:
            self.guard.take_named()
        evidence = self.guard.evidence
        marker = CommitReport.marker(
            evidence.proofs(), tuple(evidence.checked), self.guard.refused_in(attempt)
        )
        self.committer.post_marker(attempt, marker)

    def post_refusals(self) -> None:
        """A stage's all-reduce broke: if this peer refused a reducer's averages there, say so in its
        marker now, so the partners of that group stop waiting for a confirmation that never comes."""
        attempt = self.guard.attempt
        if not self.robust or attempt is None:
            return
        self.guard.take_named()
        if self.guard.refused_in(attempt):
            try:
                self.post_marker(attempt, taken=True)
            except Exception as e:  # the DHT may fail a store: the partners then wait out their bound
                logger.debug(f"could not post this peer's refusals: {e}")
