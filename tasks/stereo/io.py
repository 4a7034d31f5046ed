"""Readers (and writers, for tests and tools) of the disparity formats real stereo data sets use.

* PFM (FlyingThings3D / Scene Flow, Middlebury): a text header ``PF`` (3 channels) or ``Pf`` (1 channel),
  then ``width height``, then a scale whose *sign* gives the byte order (negative: little endian,
  positive: big endian), then float32 samples with the rows stored **bottom to top**.
* KITTI 2015 disparity: a 16-bit grayscale PNG; disparity = value / 256, value 0 = no measurement.

The readers return the values exactly as stored (``inf`` and NaN included); what counts as a valid
ground-truth pixel is decided in one place, :func:`tasks.stereo.data.valid_disparity`.
"""

from __future__ import annotations

import io
import os
import re
from pathlib import Path

import numpy as np
from PIL import Image

__all__ = [
    "parse_kitti_disparity",
    "parse_pfm",
    "read_image",
    "read_kitti_disparity",
    "read_pfm",
    "write_kitti_disparity",
    "write_pfm",
]

# Header: identifier, width, height, scale, each separated by whitespace; exactly one whitespace
# character separates the scale from the binary data.
_PFM_HEADER = re.compile(rb"\A(PF|Pf)\s+(\d+)\s+(\d+)\s+([-+]?[0-9.eE+-]+)\s")


def read_pfm(path: str | os.PathLike) -> np.ndarray:
    """Read a PFM file into a float32 array, H×W (``Pf``) or H×W×3 (``PF``), top row first.

    Raises ``ValueError`` naming the file when it is not a well-formed PFM (bad magic, bad size, a zero
    scale, or fewer data bytes than the header announces).
    """
    path = Path(path)
    return parse_pfm(path.read_bytes(), path)


def parse_pfm(raw: bytes, name: object = "PFM") -> np.ndarray:
    """:func:`read_pfm` on a PFM file's bytes (a data shard keeps the file's bytes); errors name ``name``."""
    match = _PFM_HEADER.match(raw[:256])
    if match is None:
        raise ValueError(f"{name}: not a PFM file (expected a 'PF' or 'Pf' header with width, height, scale)")
    kind, width, height, scale_text = match.groups()
    width, height = int(width), int(height)
    try:
        scale = float(scale_text)
    except ValueError:
        raise ValueError(f"{name}: PFM scale {scale_text!r} is not a number") from None
    if width <= 0 or height <= 0:
        raise ValueError(f"{name}: PFM size {width}x{height} is empty")
    if scale == 0.0 or not np.isfinite(scale):
        raise ValueError(f"{name}: PFM scale {scale_text.decode()} gives no byte order (must be non-zero)")
    channels = 3 if kind == b"PF" else 1
    count = width * height * channels
    body = raw[match.end() :]
    if len(body) < 4 * count:
        raise ValueError(
            f"{name}: PFM data too short: {len(body)} bytes for {width}x{height}x{channels} floats"
        )
    dtype = np.dtype("<f4") if scale < 0 else np.dtype(">f4")
    data = np.frombuffer(body, dtype=dtype, count=count).astype(np.float32)
    shape = (height, width, 3) if channels == 3 else (height, width)
    return np.ascontiguousarray(np.flipud(data.reshape(shape)))


def write_pfm(path: str | os.PathLike, array: np.ndarray, byteorder: str = "<", scale: float = 1.0) -> None:
    """Write ``array`` (H×W or H×W×3, top row first) as PFM in the given byte order (``"<"`` or ``">"``)."""
    array = np.asarray(array, dtype=np.float32)
    if array.ndim == 3 and array.shape[2] == 3:
        kind = "PF"
    elif array.ndim == 2:
        kind = "Pf"
    else:
        raise ValueError(f"PFM holds H×W or H×W×3 arrays, got shape {array.shape}")
    if byteorder not in ("<", ">"):
        raise ValueError(f"byteorder must be '<' or '>', got {byteorder!r}")
    if not scale > 0:
        raise ValueError(f"scale must be positive (its sign is set from the byte order), got {scale}")
    signed_scale = -abs(scale) if byteorder == "<" else abs(scale)
    header = f"{kind}\n{array.shape[1]} {array.shape[0]}\n{signed_scale}\n".encode("ascii")
    body = np.flipud(array).astype(np.dtype(byteorder + "f4")).tobytes()
    Path(path).write_bytes(header + body)


def read_kitti_disparity(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray]:
    """Read a KITTI 2015 disparity PNG: returns (float32 disparity = value / 256, bool valid = value > 0).

    Raises ``ValueError`` naming the file when it is not a single-channel 16-bit PNG.
    """

    path = Path(path)
    return parse_kitti_disparity(path.read_bytes(), path)


def parse_kitti_disparity(raw: bytes, name: object = "disparity") -> tuple[np.ndarray, np.ndarray]:
    """:func:`read_kitti_disparity` on a PNG file's bytes; errors name ``name``."""
    try:
        with Image.open(io.BytesIO(raw)) as image:
            mode = image.mode
            values = np.array(image)
    except OSError as exc:
        raise ValueError(f"{name}: cannot read as an image ({exc})") from None
    if mode not in ("I;16", "I;16B", "I") or values.ndim != 2:
        raise ValueError(f"{name}: KITTI disparity must be a 16-bit single-channel PNG, got mode {mode!r}")
    if values.dtype != np.uint16:
        if values.min() < 0 or values.max() > 65535:
            raise ValueError(f"{name}: KITTI disparity values outside 0..65535")
        values = values.astype(np.uint16)
    return values.astype(np.float32) / 256.0, values > 0


def write_kitti_disparity(
    path: str | os.PathLike, disparity: np.ndarray, valid: np.ndarray | None = None
) -> None:
    """Write a disparity map as a KITTI 16-bit PNG (rounded to 1/256 px; invalid pixels stored as 0)."""

    disparity = np.asarray(disparity, dtype=np.float64)
    if disparity.ndim != 2:
        raise ValueError(f"disparity must be H×W, got shape {disparity.shape}")
    ok = np.isfinite(disparity) & (disparity >= 0)
    if valid is not None:
        ok &= np.asarray(valid, dtype=bool)
    values = np.where(ok, np.clip(np.round(disparity * 256.0), 1, 65535), 0).astype(np.uint16)
    Image.fromarray(values).save(path, format="PNG")


def read_image(path: str | os.PathLike) -> np.ndarray:
    """Read an image file as float32 RGB in [0, 1], H×W×3 (grayscale is repeated to three channels)."""

    path = Path(path)
    try:
        with Image.open(path) as image:
            rgb = image.convert("RGB")
            return np.asarray(rgb, dtype=np.float32) / 255.0
    except OSError as exc:
        raise ValueError(f"{path}: cannot read as an image ({exc})") from None
