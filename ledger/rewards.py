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
from protocol.sealing import parse_sealed


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
    credited: dict[int, tuple[bytes, int, bytes]] = {}  # receipt index -> key, credit, leaf hash
    totals: dict[bytes, list] = {}  # key -> [credits, entries, revoked, {peer id: None}]
    revoked: set[int] = set()
    ignored = 0
    for index, data in enumerate(entries):
        try:
            sealed = parse_sealed(data, LEDGER_ENTRY_TYPES)
        except ValueError as exc:
            raise ValueError(f"entry {index} is not a ledger record ({exc})") from None
        record = sealed.record
        if isinstance(record, ContributionReceipt):
            row = totals.setdefault(sealed.public_key, [0, 0, 0, {}])
            row[0] += record.credit
            row[1] += 1
            row[3][record.peer_id] = None
            credited[index] = (sealed.public_key, record.credit, leaf_hash(data))
        elif isinstance(record, Revocation):
            target = credited.get(record.entry_index)
            if (
                target is None
                or target[2].hex() != record.entry_leaf_hash
                or (log_public_key is not None and sealed.public_key != log_public_key)
            ):
                ignored += 1
            elif record.entry_index not in revoked:
                revoked.add(record.entry_index)
                row = totals[target[0]]
                row[0] -= target[1]
                row[1] -= 1
                row[2] += 1
    total = sum(row[0] for row in totals.values())
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
        for key, row in totals.items()
    ]
    peers.sort(key=lambda p: (-p.credits, p.public_key))
    return Rewards(total, tuple(peers), len(credited), len(revoked), ignored)
