"""A volunteer client that cheats in one way, for the swarm tests that check the aggregator catches it.

Run as ``python tests/adversaries/dishonest_peer.py FAULT join ...`` (the arguments of ``manta-peer
join``): it is the real peer with one of its two replaceable parts (:meth:`PeerNode.receipt_wire`,
:meth:`PeerNode.open_evaluation_service`) overridden, so everything else it does is what an honest
peer does. The faults live here, in test code, and nowhere in ``peer/``:

- ``forge``: a receipt whose signature does not verify under the key it names;
- ``replay``: re-sends its first accepted receipt every round;
- ``inflate``: claims ten times the samples it computed;
- ``fabricate``: commits to a made-up gradient sketch;
- ``search-lie``: receipts stay honest, but the search service answers ``1 - value`` for every config;
- ``silent``: announces itself like any peer (a signed roster entry, kept fresh) and never averages:
  a laptop gone to sleep, or a key that wants to stall the swarm.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import peer.cli
from peer.node import PeerNode
from peer.search_service import EvaluationService
from protocol.averaging_group import averaging_group_id, group_membership
from protocol.records import ContributionReceipt, TaskSpec, seal

FAULTS = ("forge", "replay", "inflate", "fabricate", "search-lie", "silent")
SILENT_SECONDS = 600.0  # how long a silent peer stays announced at most (Ctrl-C ends it sooner)


def dishonest_wire(fault: str, peer: PeerNode, receipt: ContributionReceipt) -> bytes | None:
    """What a peer with ``fault`` files instead of the honest receipt (None: the honest one)."""
    if fault == "forge":  # flip one hex digit of the signature
        wire = bytearray(seal(receipt, peer.identity))
        wire[-3] = ord("0") if wire[-3] != ord("0") else ord("1")
        return bytes(wire)
    if fault == "replay":
        settled = sorted(peer._outbox.dir.glob("settled/*.receipt"))
        return settled[0].read_bytes() if settled else None
    if fault == "inflate":
        # The honest group's root does not count ten times its samples (the proof would fail), so the
        # inflated claim comes with a group of its own, which no other receipt of the round names.
        view = group_membership([(receipt.peer_id, receipt.samples * 10)], receipt.peer_id)
        claimed = receipt.model_dump() | dict(
            samples=receipt.samples * 10,
            worker_samples=tuple(w * 10 for w in receipt.worker_samples),
            group_id=averaging_group_id(receipt.task_id, receipt.round, view, receipt.state_digest),
            group_root=view.root,
            group_size=view.size,
            group_index=view.index,
            group_proof=view.proof,
        )
        return seal(ContributionReceipt(**claimed), peer.identity)
    if fault == "fabricate":
        rng = random.Random(receipt.round)
        fake = tuple(rng.randint(-(10**9), 10**9) for _ in receipt.grad_sketch)
        return seal(ContributionReceipt(**{**receipt.model_dump(), "grad_sketch": fake}), peer.identity)
    return None


class LyingEvaluationService(EvaluationService):
    def _evaluate(self, body: dict) -> dict:
        answer = super()._evaluate(body)
        answer["results"] = {k: 1.0 - v for k, v in answer["results"].items()}
        return answer


def dishonest_node(fault: str) -> type[PeerNode]:
    class DishonestPeer(PeerNode):
        def run(self):
            if fault != "silent":
                return super().run()
            self._announcer.announce()
            self._announcer.keep_fresh()
            self._stop.wait(timeout=SILENT_SECONDS)
            return self.reports

        def receipt_wire(self, receipt: ContributionReceipt) -> bytes | None:
            return dishonest_wire(fault, self, receipt)

        def open_evaluation_service(self, task: TaskSpec) -> EvaluationService:
            if fault != "search-lie":
                return super().open_evaluation_service(task)
            return LyingEvaluationService(
                self._endpoint, task.task_id, tuple(task.aggregator_keys), self.config.data_dir
            )

    return DishonestPeer


def command(fault: str) -> list[str]:
    """The command that starts such a peer (in place of ``manta-peer``)."""
    # As a script, not ``-m``: it needs only the installed packages, not the repository on sys.path.
    return [sys.executable, str(Path(__file__).resolve()), fault]


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in FAULTS:
        sys.exit(f"usage: python tests/adversaries/dishonest_peer.py {{{','.join(FAULTS)}}} join ...")
    peer.cli.NODE_CLASS = dishonest_node(sys.argv.pop(1))
    peer.cli.main()
