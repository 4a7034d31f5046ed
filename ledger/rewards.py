"""Rewards: a pure function of the ledger's entries.

``compute_rewards(entries, log_public_key=None) -> Rewards`` reads the entries' bytes in log order:

* a receipt credits its key with ``samples * flops_per_sample`` (training FLOPs; see
  :class:`protocol.records.ContributionReceipt` for the rule with several sub-networks);
* a revocation (sealed by the log key, when ``log_public_key`` is given) that names an earlier
  receipt by index *and* leaf hash cancels that receipt's credit; revoking twice changes nothing, and a
  revocation that names anything else is ignored and counted in ``ignored_revocations``.

Credit accrues to the Ed25519 key (the volunteer's lasting identity), listing the peer ids it used.
``share`` is the key's fraction of all credit. Signatures are not checked here: run ``manta-ledger
verify`` for that; this function only needs the bytes, so anyone can recompute the table.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass

from protocol.identity import fingerprint
from protocol.merkle import leaf_hash
from protocol.records import LEDGER_ENTRY_TYPES, ContributionReceipt, Revocation
from protocol.sealing import Sealed, parse_sealed


@dataclass(frozen=True)
class PeerReward:
    public_key: str  # hex
    fingerprint: str
    peer_ids: tuple[str, ...]
    credits: int  # training FLOPs credited
    share: float
    entries: int  # receipts that earn credit
    revoked: int  # receipts whose credit was cancelled


@dataclass(frozen=True)
class Rewards:
    total_credits: int
    peers: tuple[PeerReward, ...]  # most credit first
    receipts: int
    revocations: int  # applied
    ignored_revocations: int

    def to_json(self) -> dict:
        return asdict(self)


def compute_rewards(entries: Iterable[bytes], log_public_key: bytes | None = None) -> Rewards:
    """The reward table of a ledger, from its entries' bytes in log order (ValueError if unreadable)."""
    tally = RewardTally(log_public_key)
    for data in entries:
        tally.add(data)
    return tally.rewards()


class RewardTally:
    """:func:`compute_rewards` one entry at a time: :meth:`add` each entry's bytes in log order (from
    index 0), :meth:`rewards` at any point is the table of the entries added so far."""

    def __init__(self, log_public_key: bytes | None = None):
        self.log_public_key = log_public_key
        self.size = 0  # entries added
        self._credited: dict[int, tuple[bytes, int, bytes]] = {}  # receipt index -> key, credit, leaf
        self._totals: dict[bytes, list] = {}  # key -> [credits, entries, revoked, {peer id: None}]
        self._revoked: set[int] = set()
        self._ignored = 0

    def add(self, data: bytes) -> Sealed[ContributionReceipt] | Sealed[Revocation] | None:
        """Count the next entry; returns it opened, or None for a revocation that was ignored."""
        index, self.size = self.size, self.size + 1
        try:
            sealed = parse_sealed(data, LEDGER_ENTRY_TYPES)
        except ValueError as exc:
            raise ValueError(f"entry {index} is not a ledger record ({exc})") from None
        record = sealed.record
        if isinstance(record, ContributionReceipt):
            row = self._totals.setdefault(sealed.public_key, [0, 0, 0, {}])
            row[0] += record.credit
            row[1] += 1
            row[3][record.peer_id] = None
            self._credited[index] = (sealed.public_key, record.credit, leaf_hash(data))
            return sealed
        target = self._credited.get(record.entry_index)
        if (
            target is None
            or target[2].hex() != record.entry_leaf_hash
            or (self.log_public_key is not None and sealed.public_key != self.log_public_key)
        ):
            self._ignored += 1
            return None
        if record.entry_index not in self._revoked:
            self._revoked.add(record.entry_index)
            row = self._totals[target[0]]
            row[0] -= target[1]
            row[1] -= 1
            row[2] += 1
        return sealed

    def rewards(self) -> Rewards:
        total = sum(row[0] for row in self._totals.values())
        peers = [
            PeerReward(
                public_key=key.hex(),
                fingerprint=fingerprint(key),
                peer_ids=tuple(row[3]),
                credits=row[0],
                share=row[0] / total if total else 0.0,
                entries=row[1],
                revoked=row[2],
            )
            for key, row in self._totals.items()
        ]
        peers.sort(key=lambda p: (-p.credits, p.public_key))
        return Rewards(total, tuple(peers), len(self._credited), len(self._revoked), self._ignored)

    def revoked(self, index: int) -> bool:
        """Whether the receipt at ``index`` is revoked (by a revocation counted so far)."""
        return index in self._revoked
