"""PFM and KITTI disparity readers on files written here, in both byte orders."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from PIL import Image

from tasks.stereo import read_kitti_disparity, read_pfm, write_kitti_disparity, write_pfm


def _handmade_pfm(path, rows_top_first, byteorder: str, kind: str = "Pf", scale: float = 1.0):
    """Write a PFM by hand, independently of write_pfm: rows bottom to top, sign of scale = order."""
    height, width = len(rows_top_first), len(rows_top_first[0])
    signed = -scale if byteorder == "<" else scale
    header = f"{kind}\n{width} {height}\n{signed}\n".encode()
    values = [v for row in reversed(rows_top_first) for v in np.ravel(row)]
    path.write_bytes(header + struct.pack(f"{byteorder}{len(values)}f", *values))


@pytest.mark.parametrize("byteorder", ["<", ">"])
def test_read_pfm_handmade_grayscale_both_byte_orders(tmp_path, byteorder):
    rows = [[1.0, 2.0, 3.0], [4.5, -5.25, 6.0]]  # top row first
    path = tmp_path / "g.pfm"
    _handmade_pfm(path, rows, byteorder)
    out = read_pfm(path)
    assert out.dtype == np.float32 and out.shape == (2, 3)
    np.testing.assert_array_equal(out, np.array(rows, dtype=np.float32))


@pytest.mark.parametrize("byteorder", ["<", ">"])
def test_read_pfm_handmade_color_both_byte_orders(tmp_path, byteorder):
    rows = [[[1, 2, 3], [4, 5, 6]], [[7, 8, 9], [10, 11, 12]], [[13, 14, 15], [16, 17, 18]]]
    path = tmp_path / "c.pfm"
    _handmade_pfm(path, rows, byteorder, kind="PF", scale=0.5)
    out = read_pfm(path)
    assert out.dtype == np.float32 and out.shape == (3, 2, 3)
    np.testing.assert_array_equal(out, np.array(rows, dtype=np.float32))


@pytest.mark.parametrize("byteorder", ["<", ">"])
@pytest.mark.parametrize("shape", [(5, 7), (4, 6, 3)])
def test_write_then_read_pfm_round_trips_with_inf_and_nan(tmp_path, byteorder, shape):
    rng = np.random.default_rng(0)
    array = rng.normal(size=shape).astype(np.float32) * 50
    array.flat[3] = np.inf
    array.flat[5] = np.nan
    path = tmp_path / "r.pfm"
    write_pfm(path, array, byteorder=byteorder)
    raw = path.read_bytes()
    assert raw.startswith(b"PF\n" if len(shape) == 3 else b"Pf\n")
    scale_line = raw.split(b"\n")[2]
    assert (float(scale_line) < 0) == (byteorder == "<")
    np.testing.assert_array_equal(read_pfm(path), array)  # NaN == NaN for assert_array_equal


def test_write_pfm_stores_rows_bottom_to_top(tmp_path):
    path = tmp_path / "o.pfm"
    write_pfm(path, np.array([[1.0], [2.0]], dtype=np.float32), byteorder="<")
    body = path.read_bytes().split(b"\n", 3)[3]
    assert struct.unpack("<2f", body) == (2.0, 1.0)


@pytest.mark.parametrize(
    "content, message",
    [
        (b"P6\n2 2\n255\n" + bytes(12), "not a PFM"),
        (b"Pf\n2 2\n0.0\n" + bytes(16), "byte order"),
        (b"Pf\n4 4\n-1.0\n" + bytes(10), "too short"),
        (b"", "not a PFM"),
    ],
)
def test_read_pfm_rejects_malformed_files_naming_them(tmp_path, content, message):
    path = tmp_path / "bad.pfm"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=message) as info:
        read_pfm(path)
    assert "bad.pfm" in str(info.value)


def test_read_kitti_disparity_divides_by_256_and_marks_zero_invalid(tmp_path):
    values = np.array([[0, 256, 257], [65535, 0, 5120]], dtype=np.uint16)
    path = tmp_path / "000000_10.png"
    Image.fromarray(values).save(path)
    disparity, valid = read_kitti_disparity(path)
    assert disparity.dtype == np.float32 and valid.dtype == bool
    np.testing.assert_array_equal(valid, values > 0)
    np.testing.assert_allclose(disparity, values / 256.0, rtol=0, atol=0)
    assert disparity[1, 2] == 20.0 and disparity[0, 2] == pytest.approx(1.00390625)


def test_write_kitti_disparity_round_trips_to_1_over_256(tmp_path):
    rng = np.random.default_rng(1)
    disparity = rng.uniform(0.5, 200.0, size=(6, 9)).astype(np.float32)
    disparity[0, 0] = np.nan
    disparity[1, 1] = -3.0
    path = tmp_path / "d.png"
    write_kitti_disparity(path, disparity)
    out, valid = read_kitti_disparity(path)
    expected_valid = np.isfinite(disparity) & (disparity >= 0)
    np.testing.assert_array_equal(valid, expected_valid)
    assert np.abs(out[valid] - disparity[valid]).max() <= 0.5 / 256 + 1e-6


def test_read_kitti_disparity_rejects_an_8_bit_png(tmp_path):
    path = tmp_path / "eight.png"
    Image.fromarray(np.zeros((3, 3), dtype=np.uint8)).save(path)
    with pytest.raises(ValueError, match="16-bit"):
        read_kitti_disparity(path)


def test_read_kitti_disparity_rejects_a_non_image(tmp_path):
    path = tmp_path / "junk.png"
    path.write_bytes(b"not an image")
    with pytest.raises(ValueError, match="junk.png"):
        read_kitti_disparity(path)
