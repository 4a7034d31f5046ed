"""A volunteer client that cheats in one way, for the swarm tests that check the aggregator catches it.

Run as ``python tests/adversaries/dishonest_peer.py FAULT join ...`` (the arguments of ``manta-peer
join``): it is the real peer with one of its replaceable parts (:meth:`PeerNode.receipt_wire`,
:attr:`PeerNode.kinds`) replaced, so everything else it does is what an honest
peer does. The faults live here, in test code, and nowhere in ``peer/``:

- ``forge``: a receipt whose signature does not verify under the key it names;
- ``replay``: re-sends its first accepted receipt every round;
- ``inflate``: claims ten times the samples it computed;
- ``fabricate``: commits to a made-up gradient sketch;
- ``search-lie``: receipts stay honest, but the search service answers ``1 - value`` for every config;
- ``silent``: announces itself like any peer (a signed roster entry, kept fresh) and never averages:
  a laptop gone to sleep, or a key that wants to stall the swarm (a Sybil).

The red team of issue 19 (``benchmarks/red_team.py``) adds:

- ``flops``: its honest receipt, pricing a sample at ten times its sub-networks' FLOPs;
- ``self-group``: its honest samples, in a group of its own that nobody else committed;
- ``group-inflate``: tells its averaging group ten times its samples (and sends ten times its
  numerator, so its mean looks honest); the group commits that count, the receipt proves it;
- ``nan``, ``x1000``, ``sign``, ``garbage``: computes honestly, sends a poisoned gradient into the
  all-reduce (NaN; x1000; sign-flipped; random values 100 times the gradient's norm);
- ``forged-state``: averages honestly, but serves a random state claiming a round 1000 ahead, by its
  digest, beside its own;
- ``rogue-progress``: publishes progress records of a round 10^9 ahead with 10^6 times its samples;
- ``lying-reducer``: computes and sends honestly, but as a reducer returns the negated centre of
  every part it reduces (a reducer decides its part's result for every member alike);
- ``noisy-reducer``: computes and sends honestly, but as a reducer returns every part's centre plus
  a random direction ten times its length: nearly orthogonal to every member's part, so neither
  far enough out nor pointing against them. Both lying reducers send the proof that comes closest
  to passing: the other senders' entries true, their own part moved to balance the lie;
- ``equivocating-reducer``: the noisy reducer's lie, with a proof of its own for every member (true
  about that member, every other part shifted to balance the lie), which that member's checks pass;
  it does not post the signed digests of its own proofs;
- ``hiding-reducer``: the noisy reducer's lie, hidden behind one member: it holds that member's
  results back for ``HOLD_BACK_SECONDS`` (the others have checked and committed by then; the
  member's own reducer still serves them), and tells every member the same story, its own part
  true and the held-back member's entry placed to balance the lie (:func:`absent_member_proof`);
- ``copy``: zero compute with a copied gradient. Honest for its first ``TRUSTED_AFTER`` committed
  rounds (what a new key is audited on, every one), then sends, and commits its receipts to, the
  swarm's last committed average instead of its own gradient: a vector inside the honest spread,
  which no reducer can tell from an honest one, with a receipt consistent with it. (It still runs
  its mini-batches, so that its timing stays an honest peer's; a real copier would skip them.)

and the attacks on identity and membership of ``tests/adversaries/identity_attacks.py``.
"""

from __future__ import annotations

import asyncio
import math
import random
import sys
from pathlib import Path

if __name__ == "__main__":  # run as a script: the repository's test helpers are importable too
    sys.path.insert(1, str(Path(__file__).resolve().parents[2]))

from hivemind_adapter.runtime import prepare_process  # noqa: E402

# Before hivemind's import picks torch's sharing strategy, as manta-peer does: hivemind's default
# starts a torch_shm_manager whose folder outlives a killed peer in /tmp.
prepare_process()

import torch  # noqa: E402

import hivemind_adapter.exact_runner  # noqa: E402
import peer.cli  # noqa: E402
import peer.round  # noqa: E402
from hivemind_adapter.allreduce import VerifiedAverager  # noqa: E402
from hivemind_adapter.exact_runner import ExactAllReduceRunner  # noqa: E402
from hivemind_adapter.robust_reduce import RobustPartReducer  # noqa: E402
from peer.node import PeerNode  # noqa: E402
from peer.search_service import EvaluationService  # noqa: E402
from peer.startup import PeerKinds  # noqa: E402
from peer.state_keeper import StateKeeper  # noqa: E402
from peer.swarm_view import ProgressBoard  # noqa: E402
from peer.worker_pool import WorkerPool  # noqa: E402
from protocol.averaging_group import averaging_group_id, group_membership  # noqa: E402
from protocol.records import ContributionReceipt  # noqa: E402
from protocol.sealing import seal  # noqa: E402
from robust_aggregation.reducer_proof import PartProof, make_proof, sketch, sketch_seed  # noqa: E402
from supernet.state import digest as state_digest  # noqa: E402
from tests.adversaries import identity_attacks, vote_attacks  # noqa: E402
from tests.adversaries.identity_attacks import IDENTITY_ATTACKS  # noqa: E402
from tests.adversaries.vote_attacks import VOTE_ATTACKS  # noqa: E402

FAULTS = (
    "forge", "replay", "inflate", "fabricate", "search-lie", "silent", "flops", "self-group",
    "group-inflate", "nan", "x1000", "sign", "garbage", "forged-state", "rogue-progress", "lying-reducer",
    "noisy-reducer", "equivocating-reducer", "hiding-reducer", "copy", *IDENTITY_ATTACKS, *VOTE_ATTACKS,
)  # fmt: skip
POISONS = ("nan", "x1000", "sign", "garbage")
INFLATION = 10  # group-inflate's factor
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
        inflated = receipt.model_copy(
            update=dict(
                samples=receipt.samples * 10, worker_samples=tuple(w * 10 for w in receipt.worker_samples)
            )
        )
        return seal(_alone(inflated), peer.identity)
    if fault == "fabricate":
        rng = random.Random(receipt.round)
        fake = tuple(rng.randint(-(10**9), 10**9) for _ in receipt.grad_sketch)
        return seal(ContributionReceipt(**{**receipt.model_dump(), "grad_sketch": fake}), peer.identity)
    if fault == "flops":
        return seal(
            receipt.model_copy(update=dict(flops_per_sample=receipt.flops_per_sample * 10)), peer.identity
        )
    if fault == "self-group":
        return seal(_alone(receipt), peer.identity)
    if fault == "group-inflate":  # its group counted INFLATION times its samples: the proof holds for that
        claimed = receipt.model_dump() | dict(
            samples=receipt.samples * INFLATION,
            worker_samples=tuple(w * INFLATION for w in receipt.worker_samples),
        )
        return seal(ContributionReceipt(**claimed), peer.identity)
    return None


def _alone(receipt: ContributionReceipt) -> ContributionReceipt:
    """``receipt`` in a group of its sender alone, counted with the samples it claims."""
    view = group_membership([(receipt.peer_id, receipt.samples)], receipt.peer_id)
    return ContributionReceipt(
        **receipt.model_dump()
        | dict(
            group_id=averaging_group_id(receipt.task_id, receipt.attempt, view, receipt.state_digest),
            group_root=view.root,
            group_size=view.size,
            group_index=view.index,
            group_proof=view.proof,
        )
    )


def poisoned(fault: str, numerator: list[torch.Tensor]) -> list[torch.Tensor]:
    """What a peer with a gradient ``fault`` sends into the all-reduce instead of ``numerator``."""
    if fault == "nan":
        return [torch.full_like(t, math.nan) for t in numerator]
    if fault == "x1000":
        return [t * 1000 for t in numerator]
    if fault == "sign":
        return [-t for t in numerator]
    if fault == "garbage":
        generator = torch.Generator().manual_seed(0)
        norm = math.sqrt(sum(float(t.double().pow(2).sum()) for t in numerator)) or 1.0
        noise = [torch.randn(t.shape, generator=generator, dtype=t.dtype) for t in numerator]
        scale = 100 * norm / math.sqrt(sum(float(t.double().pow(2).sum()) for t in noise))
        return [t * scale for t in noise]
    return list(numerator)


class _Attacking:
    """An averager whose ``average`` sends what ``fault`` makes of this peer's contribution."""

    def __init__(self, averager, fault: str):
        self._averager, self._fault = averager, fault

    def __getattr__(self, name):
        return getattr(self._averager, name)

    def average(self, attempt, numerator, samples, **kwargs):
        if self._fault == "group-inflate":  # INFLATION times the samples, and a mean that looks honest
            return self._averager.average(
                attempt, [t * INFLATION for t in numerator], samples * INFLATION, **kwargs
            )
        return self._averager.average(attempt, poisoned(self._fault, list(numerator)), samples, **kwargs)


def attack_averaging(fault: str) -> None:
    """Route this process's rounds' averaging through :class:`_Attacking` (the peer's own code is
    untouched: ``peer.round`` looks its ``_average`` up at each round)."""
    honest = peer.round._average

    def attacked(ctx, plan, averager, host, start_digest):
        return honest(ctx, plan, _Attacking(averager, fault), host, start_digest)

    peer.round._average = attacked
    take_any_reply()


def take_any_reply() -> None:
    """Accept whatever reducers send back: an attacker has no reason to check the replies (an honest
    member refuses one that points against the part it sent, which a poisoned part's honest reply
    does, and its step then fails for it alone)."""
    hivemind_adapter.exact_runner.implausible_reply = lambda own, reply, min_values=1024: None
    # nor keep a record of the reducers' directions (a flipped sender's own parts point against every
    # honest reply, and it would refuse them all from the second all-reduce on)
    hivemind_adapter.exact_runner.reply_cosine = lambda own, reply, min_values=1024: None
    # nor check the reducers' proofs (a poisoned part's own entry is true, but it is no check's business)
    hivemind_adapter.exact_runner.check_proof = lambda *args, **kwargs: None


HOLD_BACK_SECONDS = 4.0  # how long the hiding reducer holds one member's results (under next_chunk)
NOISE_TIMES = 10.0  # the noisy reducer's added direction, in lengths of the honest centre


def lying_runner(lie: str) -> type[ExactAllReduceRunner]:
    """An all-reduce runner whose reducer returns every part's centre scaled x1000 (``lie="x1000"``),
    plus a random direction ``NOISE_TIMES`` its length (``lie="noise"``), or negated (any other value).
    It sends with each lie the proof that comes closest to passing (:func:`covering_proof`); with
    ``lie="equivocate"`` it tells the noise lie and sends each member a proof of its own
    (:func:`equivocating_proof`), which that member's checks cannot tell from an honest one."""
    noise = torch.Generator().manual_seed(19)

    class LyingReducer(RobustPartReducer):
        own_sender: int | None = None  # this reducer's own sender index (set by its runner)
        told: dict[int, tuple[PartProof, torch.Tensor, int]]  # per part: its true proof of the lie

        def answer(self, result, parts, senders, weights, part_index):
            honest, _proof = super().answer(result, parts, senders, weights, part_index)
            if lie == "x1000":
                told = honest * 1000
            elif lie in ("noise", "equivocate", "hide"):
                direction = torch.randn(honest.shape, generator=noise).to(honest.dtype)
                length = NOISE_TIMES * torch.linalg.vector_norm(honest) / torch.linalg.vector_norm(direction)
                told = honest + direction * length
            else:
                told = -honest
            received = self.as_received(told)
            seed = sketch_seed(self.proof_context, part_index, received)
            proof = make_proof(
                dict(zip(senders, parts)), dict(zip(senders, weights)), self.num_senders, received,
                result.radius, {senders[j]: w for j, w in result.capped.items()},
                [senders[j] for j in result.in_centre], seed,
            )  # fmt: skip
            if not hasattr(self, "told"):
                self.told = {}
            self.told[part_index] = (proof, received, seed)
            if lie == "hide" and self.own_sender is not None:
                starved = starved_member(self.own_sender, self.num_senders)
                return told, absent_member_proof(proof, starved, received, seed).to_bytes()
            return told, covering_proof(proof, self.own_sender, received, seed).to_bytes()

    class LyingRunner(ExactAllReduceRunner):
        reducer_type = LyingReducer

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            if isinstance(self.tensor_part_reducer, LyingReducer):  # (a plain-mean swarm's is hivemind's)
                self.tensor_part_reducer.own_sender = self.sender_peer_ids.index(self.peer_id)

        def _proofs_message(self, sender_index: int):
            message = super()._proofs_message(sender_index)
            if lie == "equivocate":  # it does not post its own signed words against itself
                self.attestations = [a for a in self.attestations if a.reducer != self.peer_id.to_base58()]
            return message

        async def _accumulate_parts_streaming(self, stream, sender_index: int):
            replies = super()._accumulate_parts_streaming(stream, sender_index)
            reducer = self.tensor_part_reducer
            starved = (
                lie == "hide"
                and isinstance(reducer, LyingReducer)
                and reducer.own_sender is not None
                and sender_index == starved_member(reducer.own_sender, reducer.num_senders)
            )
            held_back = []
            async for message in replies:
                if starved:  # its parts are taken (the others' results need them); the replies wait
                    held_back.append(message)
                else:
                    yield message
            if held_back:
                # until the others have checked the lie (and, in a swarm, committed it): then it
                # gets them, too late to be compared, and its own step fails on its own entry
                await asyncio.sleep(HOLD_BACK_SECONDS)
                for message in held_back:
                    yield message

        def proofs_for(self, sender_index: int) -> list[bytes]:
            reducer = self.tensor_part_reducer
            if lie != "equivocate" or not isinstance(reducer, LyingReducer):
                return super().proofs_for(sender_index)
            proofs = super().proofs_for(sender_index)
            for j, (proof, received, seed) in getattr(reducer, "told", {}).items():
                proofs[j] = equivocating_proof(proof, sender_index, received, seed).to_bytes()
            return proofs

    return LyingRunner


def starved_member(own: int, senders: int) -> int:
    """The member a hiding reducer never answers: the next sender after itself."""
    return (own + 1) % senders


def covering_proof(proof: PartProof, own: int | None, result: torch.Tensor, seed: int) -> PartProof:
    """A liar's best proof of a wrong ``result``: every other sender's entry as it is (each member
    checks its own), and its own part moved to where it balances the projected fixed point (nobody
    else holds that part), with a radius past every distance so that no part is clipped (a clipped
    force is bounded by the radius; an unclipped one is not). ``proof`` lists the honest entries;
    ``own``: the liar's sender index (None, or a part it did not weigh: nothing to move)."""
    if own is None or proof.capped[own] <= 0:
        return proof
    in_centre = [i for i, inside in enumerate(proof.in_centre) if inside or i == own]
    return _balanced_by(proof, own, in_centre, result, seed)


def absent_member_proof(proof: PartProof, absent: int, result: torch.Tensor, seed: int) -> PartProof:
    """A liar's proof of ``result`` that moves only the entry of ``absent``, a member that will never
    check it (its results were held back until the others committed, or it left): every checking
    member's entry and the liar's own part as they are (so point 5 passes), ``absent``'s part placed
    to balance the projected fixed point, with a radius past every distance (nothing clipped)."""
    counted = [i for i, w in enumerate(proof.capped) if w > 0]
    if absent not in counted:
        return proof
    return _balanced_by(proof, absent, counted, result, seed)


def _balanced_by(
    proof: PartProof, mover: int, in_centre: list[int], result: torch.Tensor, seed: int
) -> PartProof:
    """``proof`` with the entry of ``mover`` placed where it balances the projected fixed point at
    ``result`` over the parts ``in_centre``, and a radius past every distance (nothing clipped)."""
    centre = sketch(result, seed)
    pull = sum(
        (proof.capped[i] * (proof.points[i] - centre) for i in in_centre if i != mover),
        torch.zeros_like(centre),
    )
    points = proof.points.clone()
    points[mover] = centre - pull / proof.capped[mover]
    distances = list(proof.distances)
    distances[mover] = float(torch.linalg.vector_norm(points[mover] - centre))
    radius = max(distances[i] for i in in_centre)
    return PartProof(
        radius, proof.weights, proof.capped, tuple(i in in_centre for i in range(len(distances))),
        tuple(distances), points,
    )  # fmt: skip


def equivocating_proof(proof: PartProof, member: int, result: torch.Tensor, seed: int) -> PartProof:
    """The proof a liar sends ``member`` alone: that member's entry as it is (it checks its own), and
    every other sender's part, the liar's own included, moved by one common shift that balances the
    projected fixed point at the lie. The others keep their spread among themselves, so the liar's
    own part still looks like one of them (point 5), and no part is clipped. Each member gets another
    proof: only comparing them shows the lie (:mod:`protocol.proof_attestation`)."""
    centre = sketch(result, seed)
    counted = [i for i, w in enumerate(proof.capped) if w > 0]
    others = [i for i in counted if i != member]
    if not others or member not in counted:
        return proof
    pull = sum((proof.capped[i] * (proof.points[i] - centre) for i in counted), torch.zeros_like(centre))
    shift = -pull / sum(proof.capped[i] for i in others)
    points = proof.points.clone()
    distances = list(proof.distances)
    for i in others:
        points[i] = points[i] + shift
        distances[i] = float(torch.linalg.vector_norm(points[i] - centre))  # as the sketch says
    radius = max(distances[i] for i in counted)
    return PartProof(
        radius, proof.weights, proof.capped, tuple(i in counted for i in range(len(distances))),
        tuple(distances), points,
    )  # fmt: skip


def lying_averager(lie: str) -> type[VerifiedAverager]:
    """A VerifiedAverager whose reducer lies as :func:`lying_runner` says."""
    # hivemind names a servicer's RPC handlers after its class: the liar must look like the others
    return type(VerifiedAverager.__name__, (VerifiedAverager,), {"runner_type": lying_runner(lie)})


def lie_as_reducer(lie: str = "negated") -> None:
    """Every averager of this process reduces as a liar (the peer's own code is untouched)."""
    VerifiedAverager.runner_type = lying_runner(lie)
    take_any_reply()


TRUSTED_AFTER = 3  # the copier's honest rounds: a new key's receipts are all audited until 3 passed


def copy_gradient() -> None:
    """From its ``TRUSTED_AFTER``-th committed round on, this peer's host numerator is the swarm's last
    committed average times its samples (the peer's own code is untouched: ``peer.round`` looks
    ``compute_until_target`` up at each round, and the receipt's commitments read the numerator)."""
    held: dict[str, object] = {"average": None, "committed": 0}
    honest_apply, honest_compute = WorkerPool.apply, peer.round.compute_until_target

    def apply(self, round_index, swarm_average):
        if swarm_average is not None:
            held["average"] = [t.clone() for t in swarm_average]
            held["committed"] += 1
        return honest_apply(self, round_index, swarm_average)

    def compute(ctx, plan):
        host, seconds, ahead = honest_compute(ctx, plan)
        if held["average"] is not None and held["committed"] >= TRUSTED_AFTER:
            for dst, src in zip(ctx.workers.host_numerator(), held["average"]):
                dst.copy_(src * host.samples)
        return host, seconds, ahead

    WorkerPool.apply = apply
    peer.round.compute_until_target = compute


def rogue_progress() -> None:
    """Publish every progress record 10^9 rounds ahead, with 10^6 times the samples."""
    honest = ProgressBoard.publish

    def publish(self, round_index, samples, throughput, *args, **kwargs):
        return honest(self, round_index + 10**9, samples * 10**6, throughput * 10**6, *args, **kwargs)

    ProgressBoard.publish = publish


class LyingEvaluationService(EvaluationService):
    def _evaluate(self, body: dict) -> dict:
        answer = super()._evaluate(body)
        answer["results"] = {k: 1.0 - v for k, v in answer["results"].items()}
        return answer


class ForgingStateKeeper(StateKeeper):
    """Serves a forged state beside its own: its own state stays what it averages from."""

    def publish(self, round_index: int, attempt: int) -> None:
        super().publish(round_index, attempt)
        forged = [torch.randn_like(t) if t.is_floating_point() else t.clone() for t in self.served()]
        consensus = self.served_consensus()
        self.archive.add(round_index + 1000, attempt, state_digest(forged[:consensus]), forged, consensus)


def dishonest_node(fault: str) -> type[PeerNode]:
    class DishonestPeer(PeerNode):
        kinds = PeerKinds(
            evaluation_service=LyingEvaluationService if fault == "search-lie" else EvaluationService,
            state_keeper=ForgingStateKeeper if fault == "forged-state" else StateKeeper,
        )

        def run(self):
            if fault in IDENTITY_ATTACKS:
                identity_attacks.start(fault, self)
            if fault in VOTE_ATTACKS:
                vote_attacks.start(fault, self)
            if fault != "silent":
                return super().run()
            self._announcer.announce()
            self._announcer.keep_fresh()
            self._stop.wait(timeout=SILENT_SECONDS)
            return self.reports

        def receipt_wire(self, receipt: ContributionReceipt) -> bytes | None:
            return dishonest_wire(fault, self, receipt)

    return DishonestPeer


def command(fault: str) -> list[str]:
    """The command that starts such a peer (in place of ``manta-peer``)."""
    # As a script, not ``-m``: it needs only the installed packages, not the repository on sys.path.
    return [sys.executable, str(Path(__file__).resolve()), fault]


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in FAULTS:
        sys.exit(f"usage: python tests/adversaries/dishonest_peer.py {{{','.join(FAULTS)}}} join ...")
    chosen = sys.argv.pop(1)
    if chosen in POISONS or chosen == "group-inflate":
        attack_averaging(chosen)
    if chosen == "rogue-progress":
        rogue_progress()
    if chosen == "lying-reducer":
        lie_as_reducer()
    if chosen == "noisy-reducer":
        lie_as_reducer("noise")
    if chosen == "equivocating-reducer":
        lie_as_reducer("equivocate")
    if chosen == "hiding-reducer":
        lie_as_reducer("hide")
    if chosen == "copy":
        copy_gradient()
    peer.cli.NODE_CLASS = dishonest_node(chosen)
    peer.cli.main()
