"""`manta-ledger`: the auditor's view of a contribution ledger."""

from __future__ import annotations

from protocol.cli_support import manta_group


@manta_group("manta-ledger", "Verify a MANTA contribution ledger, print proofs and compute rewards.")
def main() -> None:
    pass
