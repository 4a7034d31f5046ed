"""A peer's signed contribution receipts: written to disk first, delivered to the aggregator over
hivemind, kept until the aggregator's ledger proves them included.

Delivery is a direct libp2p call (``manta/<task>/submit``) to the aggregators the TaskSpec names
(their peer ids come from signed bindings under ``manta_<task>_aggregators``), not a DHT record: the
aggregator answers each submission at once (queued, or rejected with the reason), it learns the
sender's peer id from the transport (so a receipt cannot be relayed in another peer's name), and a
forged receipt still reaches the intake, which counts it, instead of vanishing in some DHT node's
validator. The outbox on disk is what makes delivery reliable: a receipt stays in
``<data dir>/receipts/pending/`` until a status call (``manta/<task>/status``) returns its ledger index
with an inclusion proof that checks against the aggregator's signed checkpoint; it survives a peer
restart and an aggregator outage (the courier simply retries).

The aggregator credits a receipt only where another member of its group reported committing it on
the commit board, whose reports live 90 s. So as a receipt is first seen here, the courier reads its
group's other reports from the board and keeps them beside it (``<seq>.witnesses``,
:mod:`protocol.witness_bundle`); an aggregator that has none when the receipt arrives (it was down
meanwhile) is handed them.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path

from hivemind_adapter.dht import read_entries, read_signed
from hivemind_adapter.p2p import Endpoint
from protocol.dht_schema import aggregators_key, commits_key, open_aggregator_value, open_commit_value
from protocol.handler_names import status_handler, submit_handler, witnesses_handler
from protocol.identity import Identity
from protocol.ledger_checkpoint import Checkpoint
from protocol.merkle import leaf_hash, verify_inclusion
from protocol.receipt_delivery import ReceiptDelivery
from protocol.records import ContributionReceipt
from protocol.sealing import RecordRejected, parse_sealed, seal
from protocol.witness_bundle import MAX_REPORTS, WitnessBundle

logger = logging.getLogger(__name__)


class ReceiptOutbox:
    """Receipts on disk: ``pending/`` until proven included, then ``settled/`` or ``rejected/``."""

    def __init__(self, directory: Path, identity: Identity):
        self.dir = Path(directory)
        self.identity = identity
        for sub in ("pending", "settled", "rejected"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()

    def next_seq(self) -> int:
        path = self.dir / "next_seq"
        return int(path.read_text()) if path.exists() else 0

    def add(self, receipt: ContributionReceipt, wire: bytes | None = None) -> bytes:
        """Store ``receipt`` (sealed here unless ``wire`` is given) and advance the sequence number."""
        wire = wire if wire is not None else seal(receipt, self.identity)
        with self._lock:
            _atomic_write(self.dir / "pending" / f"{receipt.seq:012d}.receipt", wire)
            _atomic_write(self.dir / "next_seq", str(receipt.seq + 1).encode())
        return wire

    def pending(self) -> list[tuple[Path, bytes]]:
        with self._lock:
            return [(p, p.read_bytes()) for p in sorted((self.dir / "pending").glob("*.receipt"))]

    def settle(self, path: Path, outcome: str, detail: dict) -> None:
        """Move a pending receipt to ``settled/`` or ``rejected/`` with what the aggregator said (and
        its witnesses with it)."""
        with self._lock:
            if not path.exists():
                return
            target = self.dir / outcome / path.name
            _atomic_write(target.with_suffix(".json"), json.dumps(detail).encode())
            if path.with_suffix(".witnesses").exists():
                os.replace(path.with_suffix(".witnesses"), target.with_suffix(".witnesses"))
            os.replace(path, target)

    def keep_witnesses(self, path: Path, bundle: WitnessBundle) -> None:
        """Keep ``bundle`` beside the pending receipt at ``path``."""
        with self._lock:
            if path.exists():
                _atomic_write(path.with_suffix(".witnesses"), bundle.to_bytes())

    def witnesses(self, path: Path) -> bytes | None:
        """The witness bundle kept beside the pending receipt at ``path``, if any."""
        try:
            return path.with_suffix(".witnesses").read_bytes()
        except FileNotFoundError:
            return None

    def settled_credit(self) -> int:
        """Credit of the receipts the ledger has proven included (training FLOPs)."""

        total = 0
        for path in (self.dir / "settled").glob("*.receipt"):
            try:
                total += parse_sealed(path.read_bytes(), ContributionReceipt).record.credit
            except ValueError:
                continue  # a replayed or foreign record kept by a test fault: not ours to count
        return total

    def settled(self) -> list[dict]:
        return [json.loads(p.read_text()) for p in sorted((self.dir / "settled").glob("*.json"))]


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


class AggregatorLink:
    """Calls to the task's aggregators, through the node's endpoint (which the caller owns)."""

    def __init__(self, dht, endpoint: Endpoint, task_id: str, aggregator_keys: tuple[str, ...]):
        self.dht, self.endpoint, self.task_id, self.keys = dht, endpoint, task_id, set(aggregator_keys)

    def aggregators(self) -> dict[str, str]:
        """public key hex -> peer id of every aggregator of the task that published a binding."""
        bindings = read_signed(self.dht, aggregators_key(self.task_id), open_aggregator_value)
        return {b.public_key.hex(): b.record.peer_id for b in bindings if b.public_key.hex() in self.keys}

    def call(self, peer_id: str, handler: str, payload: bytes, timeout: float = 20.0) -> dict:
        return json.loads(self.endpoint.call(peer_id, handler, payload, timeout))


def check_proof(reply: dict, wire: bytes, aggregator_key: str) -> bool:
    """Whether ``reply`` proves ``wire`` included: its index and audit path lead to the root of a
    checkpoint note signed by ``aggregator_key``."""
    try:
        checkpoint = Checkpoint.from_note(reply["checkpoint"], bytes.fromhex(aggregator_key))
        proof = [bytes.fromhex(h) for h in reply["proof"]]
        return verify_inclusion(wire, int(reply["index"]), checkpoint.size, proof, checkpoint.root_bytes)
    except (KeyError, ValueError, TypeError):
        return False


# A receipt older than this has no reports left on the commit board to keep (they live 90 s).
WITNESS_READ_SECONDS = 120.0


def read_witnesses(dht, task_id: str, wire: bytes) -> WitnessBundle | None:
    """The signed reports on the commit board, by keys other than the receipt's, that committed the
    group the receipt in ``wire`` names (None: none there)."""
    receipt = parse_sealed(wire, ContributionReceipt).record
    entries = read_entries(dht, commits_key(task_id, receipt.attempt))
    reports = []
    for sub, value in entries.items():
        if not str(sub).startswith(f"{receipt.attempt}/") or not isinstance(value, bytes):
            continue
        try:
            record = open_commit_value(task_id, sub, value).record
        except RecordRejected:
            continue
        if record.ok and record.group == receipt.group_id and record.public_key != receipt.public_key:
            reports.append(value)
    reports = reports[:MAX_REPORTS]
    return WitnessBundle(receipt.attempt, receipt.group_id, tuple(reports)) if reports else None


class ReceiptCourier:
    """Delivers pending receipts and collects their proofs, from a background thread."""

    def __init__(self, outbox: ReceiptOutbox, link: AggregatorLink, binding: bytes, interval: float = 2.0):
        """``binding``: this peer's sealed IdentityBinding, handed over with every receipt (the
        aggregator learns it from the sender alone)."""
        self.outbox, self.link, self.binding, self.interval = outbox, link, binding, interval
        self._submitted: set[str] = set()  # outbox file names handed over (answered "queued")
        self._witnesses_looked: set[str] = set()  # outbox file names whose witnesses were looked for
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="manta-courier", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.deliver_once()
            except Exception as e:  # aggregator unreachable: the receipts stay on disk and we retry
                logger.debug(f"receipt delivery failed: {type(e).__name__}: {e}")

    def deliver_once(self) -> None:
        pending = self.outbox.pending()
        if not pending:
            return
        self._keep_witnesses(pending)
        aggregators = self.link.aggregators()
        for key, peer_id in sorted(aggregators.items()):
            for path, wire in pending:
                leaf = leaf_hash(wire)
                if path.name not in self._submitted:
                    delivery = ReceiptDelivery(wire, self.binding).to_bytes()
                    reply = self.link.call(peer_id, submit_handler(self.link.task_id), delivery)
                    self._submitted.add(path.name)
                    if reply.get("status") == "queued" and reply.get("witnessed") is False:
                        self._hand_over_witnesses(peer_id, path)
                else:
                    reply = self.link.call(peer_id, status_handler(self.link.task_id), leaf.hex().encode())
                status = reply.get("status")
                if status == "rejected" and reply.get("reason") == "replay":
                    # our earlier submission was accepted but its answer was lost: ask for the proof
                    reply = self.link.call(peer_id, status_handler(self.link.task_id), leaf.hex().encode())
                    status = reply.get("status")
                if status == "accepted" and check_proof(reply, wire, key):
                    self.outbox.settle(path, "settled", {**reply, "aggregator": key, "leaf_hash": leaf.hex()})
                elif status == "rejected" and reply.get("retry"):
                    logger.info(
                        f"receipt {path.stem} not taken yet ({reply.get('reason')}): submitted again later"
                    )
                    self._submitted.discard(path.name)
                elif status == "rejected":
                    logger.warning(
                        f"receipt {path.stem} rejected: {reply.get('reason')}: {reply.get('detail', '')}"
                    )
                    self.outbox.settle(path, "rejected", reply)
                elif status == "unknown":
                    self._submitted.discard(path.name)  # the aggregator restarted without it: submit again
                elif status not in ("queued", "accepted"):
                    logger.debug(f"receipt {path.stem}: unexpected answer {reply}")
            return  # one aggregator that answered is enough

    def _keep_witnesses(self, pending: list[tuple[Path, bytes]]) -> None:
        """Read the witnesses of each receipt seen here for the first time while its group's reports
        can still be on the board (one bounded read each), and keep those found on disk."""
        now_ms = time.time() * 1000
        for path, wire in pending:
            if path.name in self._witnesses_looked:
                continue
            self._witnesses_looked.add(path.name)
            try:
                receipt = parse_sealed(wire, ContributionReceipt).record
                if now_ms - receipt.timestamp > WITNESS_READ_SECONDS * 1000 or self.outbox.witnesses(path):
                    continue
                bundle = read_witnesses(self.link.dht, self.link.task_id, wire)
            except ValueError:
                continue  # not a receipt (a test's fault): the aggregator says what it is
            if bundle is not None:
                self.outbox.keep_witnesses(path, bundle)

    def _hand_over_witnesses(self, peer_id: str, path: Path) -> None:
        """The aggregator knows no other report of the receipt's group: hand it those kept here."""
        bundle = self.outbox.witnesses(path)
        if bundle is None:
            return
        try:
            reply = self.link.call(peer_id, witnesses_handler(self.link.task_id), bundle)
            logger.info(f"receipt {path.stem}: handed over its witnesses ({reply.get('learned', 0)} learned)")
        except Exception as e:  # the receipt is refused as unwitnessed if nobody else vouches for it
            logger.debug(f"receipt {path.stem}: its witnesses were not handed over: {e}")

    def _unsubmitted(self) -> bool:
        return any(path.name not in self._submitted for path, _ in self.outbox.pending())

    def stop(self, flush_seconds: float = 0.0) -> None:
        """Stop; first, for up to ``flush_seconds``, hand over every receipt not submitted yet (the
        rest stays on disk and is delivered when the peer runs again)."""
        deadline = time.monotonic() + flush_seconds
        while (left := deadline - time.monotonic()) > 0 and self._unsubmitted():
            try:
                self.deliver_once()
            except Exception:
                pass
            if self._unsubmitted():  # nothing left: no interval's wait after the last delivery
                time.sleep(min(self.interval, left))
        self._stop.set()
        self._thread.join(timeout=30)
