"""`manta-swarm`: a developer's multi-process local swarm on 127.0.0.1."""

from __future__ import annotations

from protocol.cli_support import manta_group


@manta_group("manta-swarm", "Run one aggregator and N peers as separate local processes on 127.0.0.1.")
def main() -> None:
    pass
