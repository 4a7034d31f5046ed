"""One peer process's debugging log: its stages' and hivemind's matchmaking and all-reduce records at
DEBUG in a file of its own (the swarm tests' ``MANTA_TEST_PEER_LOGS``, ``swarm_scale --logs``)."""

from __future__ import annotations

import logging

DEBUGGED = ("peer", "hivemind_adapter", "hivemind.averaging")


def log_to_file(path: str) -> None:
    """Send this process's records of :data:`DEBUGGED` loggers, from DEBUG up, to ``path``; hivemind's
    go there only (its own handler would print each to stderr too)."""
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    for name in DEBUGGED:
        logging.getLogger(name).addHandler(handler)
        logging.getLogger(name).setLevel(logging.DEBUG)
        if name.startswith("hivemind."):
            logging.getLogger(name).propagate = False
