"""A head's final vector to every member of a group it led, exactly: :func:`broadcast`."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from hivemind_adapter.allreduce import VerifiedAverager
from peer.averaging.outcome import Attempt, Contributor
from peer.averaging.stage import RoundAborted, StageRunner
from peer.guard.peer_guard import PeerGuard
from robust_aggregation.centered_clip import without_negative_zeros
from supernet.state import digest

logger = logging.getLogger(__name__)


# Deadlines a receiver waits for its head at most: under load a head's climb can outlast one
# broadcast deadline (capped at the step bound), and a receiver that gives up loses a committed round.
RECEIVER_PATIENCE = 2


@dataclass(frozen=True)
class Broadcast:
    """One broadcast stage: ``name`` is the averager's stage ("cohort" or "cross"), ``size`` the group
    the head led, ``final`` its vector (None where it has none), ``abort`` why it aborted (None if it
    did not); ``level``/``group``: the cross-cohort tree group; ``what`` names the head in messages."""

    name: str
    size: int
    head: str
    final: list[torch.Tensor] | None
    contributors: list[Contributor]
    abort: str | None
    level: int = 0
    group: int = 0
    patience: int = 1
    what: str = "cohort leader"


def broadcast(
    stages: StageRunner,
    averager: VerifiedAverager,
    guard: PeerGuard,
    attempt: Attempt,
    spec: Broadcast,
    count: int,
) -> tuple[list[torch.Tensor], dict]:
    """Take part in ``spec``'s broadcast on ``averager`` (the head with weight 1, members with weight
    0 and zeros, so what members receive *is* the head's vector). A head of the cross-cohort tree
    that aborted takes part too, so the heads below stop waiting at once (a cohort's head that
    aborted skips its broadcast: its members read its report on the board). Returns the first
    ``count`` tensors received and the head's report; raises :class:`RoundAborted` if the head
    aborted or its vector differs from the digest it announced (then it lied: it reduced every part
    alone, over exact links).

    A head whose broadcast fails keeps its result (members only follow: it reduced every part), and
    a member it never reached costs only its own vote."""
    me = guard.peer_id
    i_head = spec.head == me
    attempt.broadcasts_taken += 1
    final = spec.final
    if i_head and final is not None:
        final = without_negative_zeros(final)  # what the reducers give back, byte for byte
    with averager.get_tensors() as buf:
        for i, b in enumerate(buf):
            if i_head and final is not None and i < len(final):  # not the cohort's roll
                b.copy_(final[i])
            else:
                b.zero_()
    report = {"lead": i_head}
    if i_head:
        report.update(
            ok=spec.abort is None and final is not None,
            reason=spec.abort or "",
            contributors=[c.to_wire() for c in spec.contributors],
            digest=digest(final) if final is not None else "",
        )
    # A receiver's wait ends when its head reports or leaves the roster; its deadline is the last bound.
    patience = spec.patience if i_head else max(RECEIVER_PATIENCE, spec.patience)
    try:
        gathered = stages.run(
            averager, spec.name, attempt.number, 1, spec.size, attempt.state_digest, level=spec.level,
            group=spec.group, patience=patience, watch="" if i_head else spec.head,
            weight=1.0 if i_head else 0.0, gather=report,
        )  # fmt: skip
    except RoundAborted as e:
        if not (i_head and report["ok"]):
            raise
        logger.info(
            f"attempt {attempt.number}: broadcast to the group this peer leads: {e}; it keeps its result"
        )
        return final, report
    lead_reports = [r for r in gathered.values() if r.get("lead")]
    if len(lead_reports) != 1:
        raise RoundAborted(f"broadcast group had {len(lead_reports)} leaders instead of 1")
    if not lead_reports[0].get("ok", False):
        raise RoundAborted(f"the {spec.what} aborted: {lead_reports[0].get('reason', '')}")
    with averager.get_tensors() as buf:
        received = [b.clone() for b in buf[:count]]  # not the cohort's roll
    if not i_head and digest(received) != lead_reports[0]["digest"]:
        leader = next(p for p, r in gathered.items() if r.get("lead"))
        if leader == spec.head:
            guard.caught(spec.head, f"its broadcast differs from the digest it announced as {spec.what}")
        raise RoundAborted(f"broadcast result differs from the {spec.what}'s digest")
    return received, lead_reports[0]
