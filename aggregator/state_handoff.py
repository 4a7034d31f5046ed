"""Taking the state a leaving peer ends on, before it leaves (``manta/<task>/state-handoff``).

A run's last state lives only on the peers that committed it, and they leave at the run's end,
often before a background fetch (:mod:`aggregator.state_prefetch`) had it. So a leaving peer names
its state (:class:`protocol.state_handoff.StateHandoff`) and keeps serving it while this fetches it;
the stop's final checkpoint then finds it here. Only a state the commit board names as held after
that attempt is fetched, from the peers that reported holding it and the caller (checked against
the digest), once however many callers name it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from protocol.state_handoff import StateHandoff

if TYPE_CHECKING:
    from aggregator.checkpoints import CheckpointKeeper
    from aggregator.commit_witness import CommitWitness

logger = logging.getLogger(__name__)

HANDOFF_FETCH_SECONDS = 10.0  # a hand-off's fetch waits this long at most (the caller waits for it)


def take_handoff(
    payload: bytes, sender: str, witness: CommitWitness, states: CheckpointKeeper | None
) -> dict:
    """Answer one hand-off: ``{"status": "held"}`` once the named state is held here, else
    ``rejected`` or ``unavailable`` with a one-line ``detail``."""
    if states is None:
        return {"status": "rejected", "detail": "this aggregator keeps no checkpoints"}
    try:
        handoff = StateHandoff.from_bytes(payload)
    except ValueError as e:
        return {"status": "rejected", "detail": str(e)}
    holders = witness.holders_of(handoff.attempt, handoff.state_digest)
    if not holders and witness.near(handoff.attempt):
        witness.read([handoff.attempt])
        holders = witness.holders_of(handoff.attempt, handoff.state_digest)
    if not holders:
        return {
            "status": "rejected",
            "detail": f"no commit report of attempt {handoff.attempt} names state {handoff.state_digest[:12]}",
        }
    states.note_holders(handoff.state_digest, [sender, *sorted(holders - {sender})])
    if states.state_for(handoff.state_digest, HANDOFF_FETCH_SECONDS) is None:
        return {"status": "unavailable", "detail": f"state {handoff.state_digest[:12]} could not be fetched"}
    logger.debug(
        f"state {handoff.state_digest[:12]} (attempt {handoff.attempt}) held: handed over by {sender}"
    )
    return {"status": "held"}
