"""`manta-peer`: the command a volunteer runs."""

from __future__ import annotations

from protocol.cli_support import manta_group


@manta_group("manta-peer", "Lend this machine's GPUs or CPU to a MANTA training swarm.")
def main() -> None:
    pass
