"""The directory data set, ground-truth validity, pair checks and padding (bad input included)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from tasks.stereo import (
    StereoFolder,
    pad_to_multiple,
    unpad,
    valid_disparity,
    write_kitti_disparity,
    write_pfm,
)


def _image(path, height, width, seed=0):
    rgb = np.random.default_rng(seed).integers(0, 256, size=(height, width, 3), dtype=np.uint8)
    Image.fromarray(rgb).save(path)


def _folders(root, disparities, sizes=None):
    for name in ("left", "right", "disparity"):
        (root / name).mkdir(parents=True)
    for i, disparity in enumerate(disparities):
        height, width = disparity.shape
        left_size, right_size = sizes[i] if sizes else ((height, width), (height, width))
        _image(root / "left" / f"{i:04d}.png", *left_size, seed=i)
        _image(root / "right" / f"{i:04d}.png", *right_size, seed=100 + i)
        write_pfm(root / "disparity" / f"{i:04d}.pfm", disparity, byteorder="<" if i % 2 else ">")


def test_folders_layout_with_pfm_masks_nan_inf_and_negative(tmp_path):
    disparity = np.full((6, 10), 4.0, dtype=np.float32)
    disparity[0, 0], disparity[0, 1], disparity[0, 2] = np.nan, np.inf, -2.0
    _folders(tmp_path, [disparity, disparity + 1])
    ds = StereoFolder(tmp_path)
    assert ds.layout == "folders" and len(ds) == 2
    sample = ds[1]
    assert sample["left"].shape == sample["right"].shape == (3, 6, 10)
    assert sample["disparity"].shape == sample["valid"].shape == (1, 6, 10)
    valid = sample["valid"][0]
    assert not valid[0, :3].any() and valid.sum() == 60 - 3
    assert torch.isfinite(sample["disparity"]).all()  # invalid values are zeroed, never NaN
    assert sample["disparity"][0, 5, 5] == 5.0


def test_max_disparity_masks_larger_ground_truth(tmp_path):
    disparity = np.array([[1.0, 50.0], [200.0, 3.0]], dtype=np.float32)
    _folders(tmp_path, [disparity])
    valid = StereoFolder(tmp_path, max_disparity=192)[0]["valid"][0]
    assert valid.tolist() == [[True, True], [False, True]]


def test_kitti_layout(tmp_path):
    for name in ("image_2", "image_3", "disp_occ_0"):
        (tmp_path / name).mkdir()
    disparity = np.linspace(0, 30, 8 * 12, dtype=np.float32).reshape(8, 12)  # first pixel 0 = invalid
    _image(tmp_path / "image_2" / "000000_10.png", 8, 12)
    _image(tmp_path / "image_3" / "000000_10.png", 8, 12, seed=1)
    _image(tmp_path / "image_2" / "000000_11.png", 8, 12)  # the other frame of the sequence: ignored
    write_kitti_disparity(tmp_path / "disp_occ_0" / "000000_10.png", disparity, valid=disparity > 0)
    ds = StereoFolder(tmp_path)
    assert ds.layout == "kitti" and len(ds) == 1
    sample = ds[0]
    assert not sample["valid"][0, 0, 0] and sample["valid"].sum() == 8 * 12 - 1
    assert torch.allclose(sample["disparity"][0], torch.from_numpy(disparity), atol=1 / 512)


def test_left_and_right_of_different_sizes_is_a_clear_error(tmp_path):
    disparity = np.ones((6, 10), dtype=np.float32)
    _folders(tmp_path, [disparity], sizes=[((6, 10), (6, 12))])
    with pytest.raises(ValueError, match="same size"):
        StereoFolder(tmp_path)[0]


def test_disparity_of_another_size_is_a_clear_error(tmp_path):
    _folders(tmp_path, [np.ones((6, 10), dtype=np.float32)], sizes=[((6, 11), (6, 11))])
    with pytest.raises(ValueError, match="0000.pfm"):
        StereoFolder(tmp_path)[0]


def test_all_invalid_ground_truth_is_a_clear_error(tmp_path):
    _folders(tmp_path, [np.full((4, 4), -1.0, dtype=np.float32)])
    with pytest.raises(ValueError, match="no valid disparity"):
        StereoFolder(tmp_path)[0]


def test_missing_or_empty_directories_are_one_line_errors(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        StereoFolder(tmp_path / "nope")
    with pytest.raises(ValueError, match="missing left, right, disparity"):
        StereoFolder(tmp_path)
    for name in ("left", "right", "disparity"):
        (tmp_path / name).mkdir()
    with pytest.raises(ValueError, match="no complete"):
        StereoFolder(tmp_path)
    with pytest.raises(ValueError, match="layout"):
        StereoFolder(tmp_path, layout="middlebury")


def test_valid_disparity_on_arrays_and_tensors():
    values = [1.0, 0.0, -0.5, float("nan"), float("inf"), 300.0]
    expected = [True, True, False, False, False, False]
    assert valid_disparity(np.array(values), max_disparity=256).tolist() == expected
    assert valid_disparity(torch.tensor(values), max_disparity=256).tolist() == expected


def test_pad_to_multiple_keeps_coordinates_and_unpad_restores_the_size():
    left = torch.arange(2 * 3 * 5 * 7, dtype=torch.float32).reshape(2, 3, 5, 7)
    (padded, same), size = pad_to_multiple(left, left.clone(), multiple=4)
    assert padded.shape == (2, 3, 8, 8) and size == (5, 7)
    assert torch.equal(padded[..., :5, :7], left)  # original pixels keep their coordinates
    assert torch.equal(padded[..., 7, :7], left[..., 4, :])  # replicated border
    assert torch.equal(unpad(padded, size), left)
    (unchanged,), size = pad_to_multiple(padded, multiple=4)
    assert unchanged is padded and size == (8, 8)
