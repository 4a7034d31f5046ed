"""`manta-aggregator`: the command a bootstrap/aggregator operator runs."""

from __future__ import annotations

from protocol.cli_support import manta_group


@manta_group(
    "manta-aggregator", "Run a MANTA bootstrap aggregator: seed the swarm, publish the task, keep the books."
)
def main() -> None:
    pass
