"""Leaving the state this peer ends on with the task's aggregators (``manta/<task>/state-handoff``).

A run's last state lives only on its peers. Before it stops serving, a leaving peer names the state
it holds and the attempt that committed it, and waits (bounded) while each aggregator fetches it, so
the operator's final checkpoint is the swarm's last committed round (:mod:`aggregator.state_handoff`).
"""

from __future__ import annotations

import logging
import time

from peer.receipts import AggregatorLink
from protocol.handler_names import state_handoff_handler
from protocol.state_handoff import StateHandoff

logger = logging.getLogger("manta.peer")

HANDOFF_SECONDS = 15.0  # the whole hand-off waits this long at most (the aggregator fetches for 10 s)


def hand_over_state(link: AggregatorLink, handoff: StateHandoff, round_index: int, timeout: float) -> int:
    """Ask each aggregator of the task to take ``handoff``'s state, within ``timeout`` s in all; one
    log line each. Returns how many said they hold it."""
    deadline = time.monotonic() + timeout
    held = 0
    try:
        aggregators = link.aggregators()
    except Exception as e:  # an unreachable DHT: nobody to hand it to
        logger.info(f"the final state was handed to no aggregator: {type(e).__name__}: {e}")
        return 0
    for key, peer_id in sorted(aggregators.items()):
        left = deadline - time.monotonic()
        if left <= 0:
            break
        what = f"the final state {handoff.state_digest[:12]} (round {round_index}) to aggregator {key[:8]}"
        try:
            reply = link.call(peer_id, state_handoff_handler(link.task_id), handoff.to_bytes(), timeout=left)
        except Exception as e:  # gone, or too slow: the aggregator's checkpoints end earlier
            logger.info(f"{what}: not handed over: {type(e).__name__}: {e}")
            continue
        if reply.get("status") == "held":
            held += 1
            logger.info(f"{what}: held there")
        else:
            logger.info(f"{what}: not taken: {reply.get('detail', reply)}")
    return held
