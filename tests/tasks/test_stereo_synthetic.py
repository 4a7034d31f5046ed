"""The procedural stereo data: deterministic by seed, exact ground truth, real occlusions."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tasks.stereo import SyntheticStereo, generate_pair


def _warp_right_by(right: torch.Tensor, disparity: torch.Tensor) -> torch.Tensor:
    """Sample the right image at x - d (bilinear), i.e. what the left image must look like."""
    _, height, width = right.shape
    xs = torch.arange(width, dtype=torch.float64)[None].expand(height, width) - disparity[0].double()
    ys = torch.arange(height, dtype=torch.float64)[:, None].expand(height, width)
    grid = torch.stack([2 * xs / (width - 1) - 1, 2 * ys / (height - 1) - 1], -1)[None]
    return F.grid_sample(right[None].double(), grid, mode="bilinear", align_corners=True)[0]


@pytest.mark.parametrize("seed", range(6))
def test_warping_the_right_image_by_the_ground_truth_reproduces_the_left_on_valid_pixels(seed):
    pair = generate_pair(seed, height=48, width=80, max_disparity=16)
    warped = _warp_right_by(pair["right"], pair["disparity"])
    valid = pair["valid"][0]
    error = (warped - pair["left"].double()).abs().amax(0)
    assert valid.float().mean() > 0.5
    assert error[valid].max() < 1e-4
    # Invalid pixels are genuinely not reproduced: occluded or outside the right view.
    assert (~valid).any() and error[~valid].mean() > 0.05


def test_pairs_have_occlusions_inside_the_image_not_only_at_the_border():
    pair = generate_pair(3, height=64, width=128, max_disparity=24)
    valid = pair["valid"][0]
    interior = valid[:, 30:]  # beyond the widest border band (x < max_disparity)
    assert (~interior).sum() > 20


def test_disparity_range_and_dtypes():
    pair = generate_pair(7, height=32, width=64, max_disparity=12)
    assert pair["left"].shape == pair["right"].shape == (3, 32, 64)
    assert pair["disparity"].shape == pair["valid"].shape == (1, 32, 64)
    assert pair["left"].dtype == torch.float32 and pair["valid"].dtype == torch.bool
    d = pair["disparity"]
    assert torch.isfinite(d).all() and d.min() >= 0 and d.max() <= 12 + 1e-4
    assert 0 <= pair["left"].min() and pair["left"].max() <= 1
    assert d.std() > 0.5  # not a constant map


def test_same_seed_same_pair_different_seed_different_pair():
    a, b, c = generate_pair(11, 32, 64, 12), generate_pair(11, 32, 64, 12), generate_pair(12, 32, 64, 12)
    for key in a:
        assert torch.equal(a[key], b[key])
    assert not torch.equal(a["left"], c["left"])


def test_dataset_items_depend_only_on_seed_and_index():
    ds = SyntheticStereo(5, height=32, width=64, max_disparity=12, seed=3)
    cached = SyntheticStereo(5, height=32, width=64, max_disparity=12, seed=3, cache=True)
    other = SyntheticStereo(5, height=32, width=64, max_disparity=12, seed=4)
    assert len(ds) == 5
    assert torch.equal(ds[4]["disparity"], cached[4]["disparity"])  # regardless of access order
    assert torch.equal(ds[-1]["left"], ds[4]["left"])
    assert cached[4] is cached[4]
    assert not torch.equal(ds[0]["left"], other[0]["left"])
    with pytest.raises(IndexError):
        ds[5]


def test_generator_rejects_bad_arguments():
    with pytest.raises(ValueError, match="max_disparity"):
        generate_pair(0, 32, 64, 0)
    with pytest.raises(ValueError, match="size"):
        generate_pair(0, 1, 64, 8)
