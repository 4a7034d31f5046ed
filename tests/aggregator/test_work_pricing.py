"""The aggregator prices a receipt from the sub-networks it derives for the round and cohort: the
same FLOPs the peer's workers count while training, and nothing a receipt claims beyond them."""

from __future__ import annotations

import torch

from aggregator.work_pricing import WorkPricing
from protocol.identity import Identity
from protocol.sealing import RejectReason
from supernet.training.gradients import sandwich_flops_per_sample
from supernet.training.schedule import cohort_configs, step_configs
from supernet.workload import workload_for
from tests.protocol.factories import receipt

OPTIONS = dict(width_mult=0.25, head_channels=64, channel_divisor=4, batch_size=32, num_subnets=3)
ROUND = 5


def _workload():
    return workload_for("digits", dict(OPTIONS))


def test_the_derived_price_is_what_the_workers_count_while_training():
    workload = _workload()
    net = workload.build()
    configs = step_configs(net, ROUND, workload.cfg)
    batch = workload.batch(list(range(16)), torch.Generator().manual_seed(0))
    stats = workload.accumulate(net, batch, configs, torch.device("cpu"), torch.Generator().manual_seed(1))
    priced = WorkPricing(workload, "data").price(ROUND)
    assert stats["train_macs"] == priced.flops_per_sample * 16
    assert priced.flops_per_sample == sandwich_flops_per_sample(
        net, configs, workload.cfg, workload.input_size
    )
    assert priced.subnet_hashes == tuple(dict.fromkeys(c.hash for c in configs))


def test_a_receipt_is_refused_when_it_prices_or_names_other_work():
    workload = _workload()
    pricing = WorkPricing(workload, "data")
    priced = pricing.price(ROUND)
    identity = Identity.generate()
    honest = receipt(
        identity, 1, round=ROUND, subnet_hashes=priced.subnet_hashes, flops_per_sample=priced.flops_per_sample
    )
    assert pricing.check(honest) is None
    inflated = honest.model_copy(update=dict(flops_per_sample=priced.flops_per_sample * 10))
    reason, detail = pricing.check(inflated)
    assert reason is RejectReason.MISPRICED and "FLOPs" in detail
    other_round = pricing.price(ROUND + 1)
    renamed = honest.model_copy(
        update=dict(subnet_hashes=other_round.subnet_hashes, flops_per_sample=other_round.flops_per_sample)
    )
    assert other_round.subnet_hashes != priced.subnet_hashes
    assert pricing.check(renamed)[0] is RejectReason.MISPRICED


def test_model_parallel_cohorts_are_priced_by_their_rank():
    """Each cohort of a model-parallel round trains its share: claiming the rank that trains the
    largest sub-network is refused when the receipt names another rank's work, and vice versa."""
    workload = _workload()
    pricing = WorkPricing(workload, "model")
    net = workload.build()
    shares = [cohort_configs(net, ROUND, workload.cfg, rank, 3)[0] for rank in range(3)]
    prices = [pricing.price(ROUND, rank, 3) for rank in range(3)]
    for share, priced in zip(shares, prices):
        assert priced.subnet_hashes == tuple(dict.fromkeys(c.hash for c in share))
    assert prices[0].flops_per_sample > prices[2].flops_per_sample  # rank 0 has the largest (sandwich rule)
    identity = Identity.generate()
    honest = receipt(
        identity, 1, round=ROUND, subnet_hashes=prices[2].subnet_hashes,
        flops_per_sample=prices[2].flops_per_sample, cohort_rank=2, num_cohorts=3,
    )  # fmt: skip
    assert pricing.check(honest) is None
    greedy = honest.model_copy(update=dict(flops_per_sample=prices[0].flops_per_sample))
    assert pricing.check(greedy)[0] is RejectReason.MISPRICED
    claims_rank0 = honest.model_copy(update=dict(cohort_rank=0))
    assert pricing.check(claims_rank0)[0] is RejectReason.MISPRICED
