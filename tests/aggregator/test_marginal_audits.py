"""Audits weigh a distance against what float32 rounding can do (aggregator/audits.py): an honest
peer's replay is rarely past 0.05, a fabricated gradient is near 1. A marginal distance (a gradient
off by 5 to 25 %) revokes nothing on its own; a second one before a pass excludes the key.
Real replays from the keeper's state, a real SQLite ledger, real signatures."""

from __future__ import annotations

from contextlib import contextmanager

from aggregator.audits import FAIL_BEYOND, PASS_WITHIN, Verdict
from aggregator.checkpoints import CheckpointKeeper
from aggregator.contributions import ContributionDesk
from hivemind_adapter.p2p import Endpoint
from protocol.identity import Identity
from protocol.records import ContributionReceipt, Revocation
from protocol.sealing import parse_sealed
from supernet.contribution import compute_contribution, contribution_sketch
from supernet.sketch import encode_sketch
from supernet.state import digest as state_digest
from supernet.state import init_optimizer_state, load_state_tensors
from supernet.training.schedule import step_configs
from supernet.workload import workload_for
from tests.helpers import two_task_dhts
from tests.protocol.factories import TASK, peer_id_of, sealed_receipt, task_spec
from tests.supernet.threads import single_torch_thread  # noqa: F401

SEED, SAMPLES = 7, 32  # the seed of tests.protocol.factories.task_spec
SMALL = dict(seed=SEED, batch_size=32, num_subnets=2, width_mult=0.25, head_channels=64, total_steps=8)


def _receipts(workload, state, digest, identity, scales):
    """One receipt per round ``r`` of ``scales``: the honest sketch of that round's work from
    ``state``, multiplied by ``scales[r]`` (1.0: honest)."""
    net = workload.build()
    optimizer = workload.make_optimizer(net)
    init_optimizer_state(net, optimizer)
    load_state_tensors(net, optimizer, [t.clone() for t in state])
    peer = peer_id_of(identity)
    out = []
    for round_, scale in enumerate(scales):
        configs = step_configs(net, round_, workload.cfg)
        work = compute_contribution(
            workload, net, configs, "cpu", SEED, round_, f"{peer}/0", go_on=lambda n: n < SAMPLES
        )
        sketch = contribution_sketch(work.numerator, SAMPLES, SEED, round_)
        out.append(sealed_receipt(
            identity, round_ + 1, round=round_, subnet_hashes=tuple(dict.fromkeys(c.hash for c in configs)),
            samples=SAMPLES, worker_samples=(SAMPLES,), grad_sketch=encode_sketch([v * scale for v in sketch]),
            state_digest=digest,
        ))  # fmt: skip
    return out


@contextmanager
def _auditing_desk(tmp_path, aggregator: Identity):
    """A desk that audits from a real keeper; yields it, its workload and the keeper's initial state
    (digest, tensors)."""
    workload = workload_for("digits", SMALL)
    with two_task_dhts(TASK) as (first, _):
        endpoint = Endpoint(first, "desk")
        keeper = CheckpointKeeper(first, endpoint, TASK, workload, tmp_path / "ckpt")
        desk = ContributionDesk(
            first, endpoint, aggregator, task_spec(aggregator), tmp_path / "l.sqlite", workload=workload,
            states=keeper,
        )  # fmt: skip
        try:
            digest = state_digest(keeper.template[: keeper.consensus])  # the initial state, cached
            yield desk, workload, digest, keeper.state_for(digest)
        finally:
            desk.shutdown()
            keeper.shutdown()


def test_one_marginal_audit_keeps_the_credit_and_a_second_before_a_pass_excludes_the_key(tmp_path):
    aggregator, peer = Identity.generate(), Identity.generate()
    with _auditing_desk(tmp_path, aggregator) as (desk, workload, digest, state):
        # rounds 0-3: off by 10 %, honest, off by 10 %, off by 10 %
        sealed = _receipts(workload, state, digest, peer, [1.1, 1.0, 1.1, 1.1])
        desk._ledger.run(lambda store: store.append_batch(sealed, aggregator))
        key = peer.public_key_hex

        first_marginal = desk.audit(sealed[0])
        assert first_marginal.verdict is Verdict.MARGINAL
        assert PASS_WITHIN < first_marginal.distance <= FAIL_BEYOND
        assert not desk.trust.is_excluded(key) and desk.trust.audit_rate(key) == 1.0  # audited until a pass

        assert desk.audit(sealed[1]).verdict is Verdict.PASSED  # a pass forgives the first
        assert desk.audit(sealed[2]).verdict is Verdict.MARGINAL
        assert not desk.trust.is_excluded(key)
        assert desk.audit(sealed[3]).verdict is Verdict.MARGINAL  # the second since the pass
        assert desk.trust.excluded() == {key}
        revocations = [
            parse_sealed(data, (ContributionReceipt, Revocation)).record
            for _, data in desk._ledger.run(lambda store: list(store.entries(4)))
        ]
        assert sorted(r.entry_index for r in revocations) == [2, 3]  # since the passed audit (entry 1)
        assert all(r.reason.startswith("audit_failed") and "second time" in r.reason for r in revocations)
        assert desk.counters["audit_marginal"] == 3 and desk.counters["audit_passed"] == 1


def test_a_made_up_gradient_fails_its_first_audit(tmp_path):
    aggregator, peer = Identity.generate(), Identity.generate()
    with _auditing_desk(tmp_path, aggregator) as (desk, workload, digest, state):
        (made_up,) = _receipts(workload, state, digest, peer, [-1.0])
        desk._ledger.run(lambda store: store.append_batch([made_up], aggregator))
        result = desk.audit(made_up)
        assert result.verdict is Verdict.FAILED and result.distance > FAIL_BEYOND
        assert desk.trust.excluded() == {peer.public_key_hex}
