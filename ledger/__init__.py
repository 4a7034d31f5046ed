"""The contribution ledger: an append-only Merkle log (RFC 9162) with signed C2SP checkpoints.

:mod:`ledger.store` keeps it in SQLite, :mod:`ledger.verify` checks a copy against its checkpoints
and proofs, :mod:`ledger.rewards` turns entries into credits, :mod:`ledger.cli` is ``manta-ledger``.
Pure Python on top of :mod:`protocol` (no torch, no hivemind): peers, auditors and the aggregator all
use it, and an auditor can install it without the training stack.
"""
