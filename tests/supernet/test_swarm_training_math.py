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


def test_the_sketch_is_its_definition_so_receipts_signed_before_still_audit():
    """Projection j is the sum of the elements times +1 where bit j of the element's word is set and
    -1 elsewhere, the words drawn one per element, tensor after tensor, from the seed's generator.
    Computed here with an explicit sign matrix; the sketch sums elements by word first."""
    g = [torch.randn(64, 32), torch.randn(7), torch.randn(1000)]
    seed = sketch_seed(7, 3)
    generator = torch.Generator().manual_seed(seed)
    words = torch.cat(
        [torch.randint(0, 1 << 16, (t.numel(),), generator=generator, dtype=torch.int32) for t in g]
    )
    signs = torch.stack([((words >> j) & 1).to(torch.float64) * 2 - 1 for j in range(16)])  # 16 x n
    expected = signs @ torch.cat([t.reshape(-1).to(torch.float64) for t in g])
    assert torch.allclose(
        torch.tensor(gradient_sketch(g, seed), dtype=torch.float64), expected, rtol=1e-12, atol=1e-9
    )
    assert gradient_sketch(g, seed, k=3) == pytest.approx(expected[:3].tolist(), rel=1e-12, abs=1e-9)


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
