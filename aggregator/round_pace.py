"""How far the desk lets the swarm's round run ahead of what it has seen.

The swarm's round (:func:`aggregator.board_reads.read_swarm_round`) decides which receipts are too
old. Members' progress records set it, and two admitted keys can still corroborate a far-off round.
So the desk goes by that round only up to :attr:`RoundPace.lead` rounds past the newest round it has
accepted a receipt of: a claimed jump moves the window by at most ``lead`` until receipts of the new
rounds pass the desk's checks, and an honest receipt of a round it has seen is never too old.
"""

from __future__ import annotations

import logging
import threading

from ledger.store import LedgerStore
from protocol.records import ContributionReceipt, Revocation
from protocol.sealing import parse_sealed

logger = logging.getLogger(__name__)

LEDGER_SCAN = 4096  # newest ledger entries read on start for the newest accepted round


def newest_receipt_round(store: LedgerStore, scan: int = LEDGER_SCAN) -> int:
    """The newest round among the last ``scan`` entries' receipts (-1: none)."""
    newest = -1
    for _, data in store.entries(max(0, store.size - scan)):
        record = parse_sealed(data, (ContributionReceipt, Revocation)).record
        if isinstance(record, ContributionReceipt):
            newest = max(newest, record.round)
    return newest


class RoundPace:
    def __init__(self, lead: int, newest_accepted: int = -1):
        if lead < 1:
            raise ValueError("lead: at least one round")
        self.lead = lead
        self._newest = newest_accepted
        self._warned_at = -1  # the capped reading last logged (one line per new claim)
        self._lock = threading.Lock()  # guards _newest and _warned_at (writer and closer threads)

    def accepted(self, round_index: int) -> None:
        """A receipt of ``round_index`` was accepted."""
        with self._lock:
            self._newest = max(self._newest, round_index)

    def bound(self, read: int) -> int:
        """The swarm round to go by, given the round the progress board shows."""
        with self._lock:
            limit = self._newest + self.lead
            if read <= limit:
                return read
            if read != self._warned_at:
                self._warned_at = read
                logger.warning(
                    f"members' progress records show round {read}; going by round {limit} "
                    f"({self.lead} past the newest round with an accepted receipt, {self._newest})"
                )
            return limit
