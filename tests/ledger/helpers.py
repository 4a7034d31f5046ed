"""Small real ledgers for aggregator tests."""

from __future__ import annotations

from pathlib import Path

from ledger.store import LedgerStore
from protocol.identity import Identity
from tests.protocol.factories import sealed_receipt

ORIGIN = "manta.test/cifar10-ofa"
AGGREGATOR = Identity.from_seed(b"\xaa" * 32)
PEERS = [Identity.from_seed(bytes([i]) * 32) for i in range(1, 6)]


def build_ledger(path: Path, batches: int = 4, revoke: int | None = None) -> list[bytes]:
    """A ledger of ``batches`` rounds, one receipt per peer each (peer k trains k times bigger subnets).

    Optionally revokes entry ``revoke`` in a last batch. Returns every entry's bytes in log order.
    """
    wires = []
    with LedgerStore.open(path, create=True, origin=ORIGIN, log_public_key=AGGREGATOR.public_key) as store:
        for round_ in range(batches):
            batch = [
                sealed_receipt(
                    peer, round_ + 1, round=round_, flops_per_sample=1_000_000 * (k + 1), samples=100
                )
                for k, peer in enumerate(PEERS)
            ]
            store.append_batch(batch, AGGREGATOR)
            wires += [s.wire for s in batch]
        if revoke is not None:
            store.revoke(revoke, "failed audit", AGGREGATOR, task_id="cifar10-ofa-test")
            wires.append(store.entry(store.size - 1))
    return wires


def tamper(path: Path, *statements: str, params: tuple = ()) -> None:
    """Alter a closed ledger file with plain sqlite3, as an attacker would (dropping the guard triggers)."""
    import sqlite3

    conn = sqlite3.connect(path)
    for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'").fetchall():
        conn.execute(f"DROP TRIGGER {name}")
    for statement in statements:
        conn.execute(statement, params) if "?" in statement else conn.execute(statement)
    conn.commit()
    conn.close()
