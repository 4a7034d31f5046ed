"""Model-parallel sub-network assignment and the gradient sketch that receipts commit to."""

from __future__ import annotations

import math

import pytest
import torch

from supernet.sketch import decode_sketch, encode_sketch, gradient_sketch, sketch_distance, sketch_seed
from supernet.training.build import build_supernet
from supernet.training.config import TrainConfig
from supernet.training.schedule import cohort_configs, step_configs


@pytest.fixture(scope="module")
def net_and_cfg():
    cfg = TrainConfig(width_mult=0.25, head_channels=64, num_subnets=4, total_steps=100)
    return build_supernet(cfg, 10, 1), cfg


def test_cohorts_deal_out_the_rounds_sandwich_list(net_and_cfg):
    net, cfg = net_and_cfg
    full = step_configs(net, 12, cfg)
    shares = [cohort_configs(net, 12, cfg, rank, 2) for rank in range(2)]
    assert [s[1] for s in shares] == [1.0, 1.0]
    assert shares[0][0] == [full[0], full[2]] and shares[1][0] == [full[1], full[3]]
    one, scale = cohort_configs(net, 12, cfg, 0, 1)
    assert one == full and scale == 1.0


def test_more_cohorts_than_subnetworks_scale_the_sum_back_to_k(net_and_cfg):
    net, cfg = net_and_cfg
    shares = [cohort_configs(net, 3, cfg, rank, 8) for rank in range(8)]
    assert all(len(c) == 1 for c, _ in shares) and {s for _, s in shares} == {4 / 8}
    assert shares[0][0][0] == net.largest_config() and shares[1][0][0] == net.smallest_config()
    with pytest.raises(ValueError):
        cohort_configs(net, 3, cfg, 8, 8)


def test_the_sketch_tolerates_rounding_but_not_a_rescaled_or_made_up_gradient():
    g = [torch.randn(64, 32), torch.randn(1000)]
    seed = sketch_seed(7, 3)
    exact = gradient_sketch(g, seed)
    assert gradient_sketch(g, seed) == exact and len(exact) == 16
    assert gradient_sketch(g, sketch_seed(7, 4)) != exact
    noisy = [t * (1 + 1e-6 * torch.randn_like(t)) for t in g]
    assert sketch_distance(gradient_sketch(noisy, seed), exact) < 1e-4
    assert sketch_distance(gradient_sketch([t * 1.1 for t in g], seed), exact) > 0.05
    assert sketch_distance(gradient_sketch([torch.randn_like(t) for t in g], seed), exact) > 0.5
    assert sketch_distance(decode_sketch(encode_sketch(exact)), exact) < 1e-8
    with pytest.raises(ValueError):
        encode_sketch([1.0, math.nan])
