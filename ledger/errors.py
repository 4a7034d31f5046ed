"""The ledger's one error type."""

from __future__ import annotations


class LedgerError(ValueError):
    """A ledger that cannot be used as asked: missing, truncated, corrupted, foreign, or a refused
    append. A ``ValueError``, so a CLI prints it as one line."""
