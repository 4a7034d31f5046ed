"""An audit whose start state cannot be had yet is tried again, and reported unavailable only when
every try failed: an honest receipt whose state comes late is audited (and passes), and none is
revoked for the aggregator's missing data (aggregator/auditing.py, aggregator/trust.py)."""

from __future__ import annotations

import time

import torch

from aggregator import auditing
from aggregator.auditing import SpotAuditor
from aggregator.audits import Verdict
from aggregator.checkpoints import CheckpointKeeper
from hivemind_adapter.dht import peer_id
from hivemind_adapter.p2p import Endpoint
from hivemind_adapter.state_archive import StateArchive
from protocol.identity import Identity
from protocol.sealing import make_sealed
from supernet.contribution import compute_contribution, contribution_sketch
from supernet.sketch import encode_sketch
from supernet.state import consensus_count, digest, init_optimizer_state, state_tensors
from supernet.training.schedule import step_configs
from supernet.workload import workload_for
from tests.helpers import two_task_dhts, wait_until
from tests.protocol.factories import TASK, peer_id_of, receipt
from tests.supernet.threads import single_torch_thread  # noqa: F401

SEED, ROUND, SAMPLES = 7, 3, 64
SMALL = dict(width_mult=0.25, head_channels=64, channel_divisor=4, batch_size=32, num_subnets=2)


def _receipt_from_a_later_state(workload, identity):
    """An honest receipt of one worker that started from a state nobody holds yet (the initial
    state, moved), and that state."""
    net = workload.build()
    optimizer = workload.make_optimizer(net)
    init_optimizer_state(net, optimizer)
    with torch.no_grad():
        for p in net.parameters():
            p.add_(0.01)
    state = [t.detach().clone() for t in state_tensors(net, optimizer)]
    configs = step_configs(net, ROUND, workload.cfg)
    work = compute_contribution(
        workload, net, configs, "cpu", SEED, ROUND, f"{peer_id_of(identity)}/0", go_on=lambda n: n < SAMPLES
    )
    sketch = encode_sketch(contribution_sketch(work.numerator, SAMPLES, SEED, ROUND))
    honest = receipt(
        identity, ROUND, subnet_hashes=tuple(dict.fromkeys(c.hash for c in configs)), samples=SAMPLES,
        worker_samples=(SAMPLES,), grad_sketch=sketch,
        state_digest=digest(state[: consensus_count(net, optimizer)]),
    )  # fmt: skip
    return state, make_sealed(honest, identity)


def test_an_audit_is_tried_again_until_its_start_state_comes_and_then_only_reported(tmp_path, monkeypatch):
    monkeypatch.setattr(auditing, "RETRY_AFTER", (1.0, 1.0, 1.0))
    workload = workload_for("digits", SMALL)
    identity = Identity.generate()
    state, sealed = _receipt_from_a_later_state(workload, identity)
    lost = make_sealed(receipt(identity, ROUND + 1, state_digest="ee" * 32), identity)  # nobody holds it
    verdicts = []
    with two_task_dhts(TASK) as (desk_dht, peer_dht):
        desk_end, peer_end = Endpoint(desk_dht, "desk"), Endpoint(peer_dht, "peer")
        keeper = CheckpointKeeper(desk_dht, desk_end, TASK, workload, tmp_path / "checkpoints")
        auditor = SpotAuditor(workload, keeper, SEED, b"secret", lambda s, r: verdicts.append((s, r.verdict)))
        archive = StateArchive(peer_end, TASK, head=len(list(workload.build().parameters())))
        try:
            auditor.enqueue(sealed)
            auditor.enqueue(lost)
            time.sleep(0.5)  # the first tries found no holder of either state
            assert verdicts == []
            # its holder comes online
            archive.add(ROUND - 1, 0, sealed.record.state_digest, state, keeper.consensus)
            keeper.note_holders(sealed.record.state_digest, [peer_id(peer_dht)])
            wait_until(lambda: len(verdicts) == 2, 120, "both audits' verdicts")
            by_receipt = {s.record.round: v for s, v in verdicts}
            assert by_receipt == {
                ROUND: Verdict.PASSED,
                ROUND + 1: Verdict.UNAVAILABLE,
            }  # passed on a retry; the other, after all
            # only the parameters crossed the link: the optimizer state is no part of a replay
            params = list(workload.build().parameters())
            assert keeper.fetched_bytes == sum(p.numel() * p.element_size() for p in params)
        finally:
            auditor.stop(timeout=60)
            archive.close()
            keeper.shutdown()
            desk_end.close()
            peer_end.close()


def test_a_queued_audits_start_state_is_kept_after_its_holders_dropped_it(tmp_path):
    # In outer mode behind 5 Mbit/s links the audit thread fell rounds behind: the states it needed had
    # left the keeper's cache and the peers' archives, and 29 of 47 audits found none.
    workload = workload_for("digits", SMALL)
    with two_task_dhts(TASK) as (desk_dht, peer_dht):
        desk_end, peer_end = Endpoint(desk_dht, "desk"), Endpoint(peer_dht, "peer")
        keeper = CheckpointKeeper(desk_dht, desk_end, TASK, workload, tmp_path / "checkpoints", cache=2)
        archive = StateArchive(peer_end, TASK, head=1, keep=1)  # a peer that keeps its newest state only
        try:
            states = [[t + i for t in keeper.template] for i in range(1, 6)]
            digests = [digest(s[: keeper.consensus]) for s in states]
            keeper.hold(digests[0])  # an audit of a receipt that started from it is queued
            for r, (d, s) in enumerate(zip(digests[:4], states)):
                archive.add(r, 0, d, s, keeper.consensus)
                keeper.note_holders(d, [peer_id(peer_dht)])
                assert keeper.state_for(d, timeout=30) is not None
            assert keeper.state_for(digests[0], timeout=5) is not None  # kept, though its holder dropped it
            assert keeper.state_for(digests[1], timeout=5) is None  # nobody's audit: out of the cache of 2
            keeper.release(digests[0])  # the audit is done
            archive.add(4, 0, digests[4], states[4], keeper.consensus)
            keeper.note_holders(digests[4], [peer_id(peer_dht)])
            assert keeper.state_for(digests[4], timeout=30) is not None
            assert keeper.state_for(digests[0], timeout=5) is None
        finally:
            archive.close()
            keeper.shutdown()
            desk_end.close()
            peer_end.close()


def test_a_prefetched_start_state_stays_while_held_ones_fill_the_cache(tmp_path):
    """A start state is prefetched when its receipt arrives and held once its audit is queued, at
    the round's close. With the cache full of held states, the one just fetched was the first to go
    (four audits of an outer-mode run found no state once the peers left)."""
    workload = workload_for("digits", SMALL)
    params = len(list(workload.build().parameters()))
    with two_task_dhts(TASK) as (desk_dht, peer_dht):
        desk_end, peer_end = Endpoint(desk_dht, "desk"), Endpoint(peer_dht, "peer")
        keeper = CheckpointKeeper(desk_dht, desk_end, TASK, workload, tmp_path / "checkpoints", cache=2)
        archive = StateArchive(peer_end, TASK, head=params, keep=1)
        try:
            states = [[t + i for t in keeper.template] for i in range(1, 5)]
            digests = [digest(s[: keeper.consensus]) for s in states]
            for r, (d, s) in enumerate(zip(digests, states)):
                archive.add(r, 0, d, s, keeper.consensus)
                keeper.note_holders(d, [peer_id(peer_dht)])
                got = keeper.start_state(d, timeout=30)  # the prefetch
                assert got is not None and torch.equal(got[0], s[0])
                if r < 2:
                    keeper.hold(d)  # queued audits fill the cache of 2
            # the holder keeps only round 3's now; round 2's audit is queued after its prefetch
            keeper.hold(digests[2])
            assert keeper.start_state(digests[2], timeout=5) is not None
            assert keeper.start_state(digests[0], timeout=5) is not None  # held
        finally:
            archive.close()
            keeper.shutdown()
            desk_end.close()
            peer_end.close()
