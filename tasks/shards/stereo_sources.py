"""Stereo data sets on disk: the layouts, pack-time checks, and decoding a pair from its file bytes.

Layouts (``kind="stereo-folder"``, ``layout`` required):

* ``"kitti2015"``: ``<dir>/training/image_2/*_10.png`` (left), ``image_3/*_10.png`` (right),
  ``disp_occ_0/*_10.png`` (16-bit disparity × 256, 0 = no measurement); ``<dir>`` may be ``training/``;
* ``"kitti2012"``: ``<dir>/training/colored_0``, ``colored_1``, ``disp_occ`` (same file conventions);
* ``"sceneflow"`` (FlyingThings3D): ``<dir>/frames_cleanpass/{TRAIN,TEST}/**/left/*.png`` and
  ``.../right/*.png`` (``frames_finalpass`` if there is no clean pass), ground truth
  ``<dir>/disparity/{TRAIN,TEST}/**/left/*.pfm``; ``TRAIN`` is the training split, ``TEST`` validation;
* ``"middlebury"`` (2014): ``<dir>/<scene>/im0.png``, ``im1.png`` and ``disp0.pfm`` (or
  ``disp0GT.pfm``); ``inf`` marks unknown disparity.

KITTI and Middlebury have no validation split: a seeded permutation puts ``max(1, round(n ×
val_fraction))`` pairs into it (:func:`split_pairs`), both splits kept in sorted order.

A sample stores the three files' original bytes (format ``"stereo/<layout>"``). Decoding
(:func:`stereo_sample`) gives what :class:`tasks.stereo.StereoFolder` gives — ``left``/``right``
3×H×W float32 in [0, 1], ``disparity`` 1×H×W float32 (0 where invalid), ``valid`` 1×H×W bool, valid =
finite and ≥ 0 (PFM) or stored value > 0 (16-bit PNG) — cropped to the task's size: the bottom rows
(KITTI's ground truth lies in the lower part of the image), horizontally centred. The disparity format
is recognised by its bytes (a PFM header, else a 16-bit PNG).
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from tasks.registry import DatasetError
from tasks.shards.container import ShardSample
from tasks.shards.image_sources import Loaded
from tasks.stereo.data import IMAGE_EXTENSIONS, valid_disparity
from tasks.stereo.io import parse_kitti_disparity, parse_pfm

__all__ = [
    "STEREO_LAYOUTS",
    "STRIDE",
    "Pair",
    "StereoSource",
    "check_crop",
    "crop_box",
    "decode_disparity",
    "decode_rgb",
    "default_crop",
    "list_stereo",
    "split_pairs",
    "stereo_sample",
    "stereo_source",
]

STRIDE = 64  # supernet.stereo.layout.STRIDE: the stereo supernet takes sizes it divides
STEREO_LAYOUTS = ("kitti2015", "kitti2012", "sceneflow", "middlebury")
_KITTI_DIRS = {
    "kitti2015": ("image_2", "image_3", "disp_occ_0"),
    "kitti2012": ("colored_0", "colored_1", "disp_occ"),
}
BYTES_PER_PIXEL = 4 * (3 + 3 + 1) + 1  # left, right, disparity as float32 and the valid mask

Pair = tuple[Path, Path, Path]  # left, right, disparity


# --------------------------------------------------------------------------------------------- listing


def _expected(layout: str, root: Path | str) -> str:
    if layout in _KITTI_DIRS:
        left, right, disp = _KITTI_DIRS[layout]
        return f"expected {root}/training/{left}/*_10.png, {right}/*_10.png, {disp}/*_10.png"
    if layout == "sceneflow":
        return f"expected {root}/frames_cleanpass/{{TRAIN,TEST}}/**/left/*.png, .../right/*.png, disparity/{{TRAIN,TEST}}/**/left/*.pfm"
    return f"expected {root}/<scene>/im0.png, im1.png, disp0.pfm"


def _need(path: Path, what: str, of: Path) -> Path:
    if not path.is_file():
        raise DatasetError(f"stereo-folder: {of} has no {what} {path}")
    return path


def _list_kitti(root: Path, layout: str) -> list[Pair]:
    if (root / "training").is_dir():
        root = root / "training"
    left_dir, right_dir, disp_dir = (root / d for d in _KITTI_DIRS[layout])
    missing = [d.name for d in (left_dir, right_dir, disp_dir) if not d.is_dir()]
    if missing:
        raise DatasetError(f"stereo-folder: {root} has no {', '.join(missing)}/ ({_expected(layout, root)})")
    lefts = sorted(p for p in left_dir.glob("*_10.png") if p.is_file())
    if not lefts:
        raise DatasetError(f"stereo-folder: no *_10.png images in {left_dir} ({_expected(layout, root)})")
    return [
        (p, _need(right_dir / p.name, "right image", p), _need(disp_dir / p.name, "disparity file", p))
        for p in lefts
    ]


def _list_sceneflow(root: Path, split: str) -> list[Pair]:
    frames = root / "frames_cleanpass"
    if not frames.is_dir() and (root / "frames_finalpass").is_dir():
        frames = root / "frames_finalpass"
    if not (frames / split).is_dir() or not (root / "disparity" / split).is_dir():
        raise DatasetError(
            f"stereo-folder: {root} has no {frames.name}/{split}/ or disparity/{split}/ ({_expected('sceneflow', root)})"
        )
    lefts = sorted(
        p
        for p in (frames / split).rglob("*")
        if p.parent.name == "left" and p.suffix.lower() in IMAGE_EXTENSIONS and p.is_file()
    )
    if not lefts:
        raise DatasetError(
            f"stereo-folder: no left/ images under {frames / split} ({_expected('sceneflow', root)})"
        )
    return [
        (
            p,
            _need(p.parent.parent / "right" / p.name, "right image", p),
            _need((root / "disparity" / p.relative_to(frames)).with_suffix(".pfm"), "disparity file", p),
        )
        for p in lefts
    ]


def _list_middlebury(root: Path) -> list[Pair]:
    scenes = sorted(p for p in root.iterdir() if p.is_dir() and (p / "im0.png").is_file())
    if not scenes:
        raise DatasetError(
            f"stereo-folder: no scene folder with im0.png in {root} ({_expected('middlebury', root)})"
        )
    pairs = []
    for scene in scenes:
        disp = scene / "disp0.pfm"
        if not disp.is_file() and (scene / "disp0GT.pfm").is_file():
            disp = scene / "disp0GT.pfm"
        left = scene / "im0.png"
        pairs.append(
            (left, _need(scene / "im1.png", "right image", left), _need(disp, "disparity file", left))
        )
    return pairs


def list_stereo(path: Path | str, layout: str | None) -> tuple[list[Pair], list[Pair] | None]:
    """The (left, right, disparity) files of the training and validation splits, sorted; validation is
    None where the layout has no split of its own. DatasetError (one line) if the layout does not fit."""
    if layout not in STEREO_LAYOUTS:
        raise DatasetError(f"stereo-folder: layout {layout!r} is not one of {', '.join(STEREO_LAYOUTS)}")
    root = Path(path).expanduser()
    if not root.is_dir():
        raise DatasetError(f"stereo-folder: {root} is not a directory ({_expected(layout, root)})")
    if layout in _KITTI_DIRS:
        return _list_kitti(root, layout), None
    if layout == "sceneflow":
        return _list_sceneflow(root, "TRAIN"), _list_sceneflow(root, "TEST")
    return _list_middlebury(root), None


def split_pairs(pairs: list[Pair], val_fraction: float, seed: int) -> tuple[list[Pair], list[Pair]]:
    """A seeded split: ``max(1, round(n × val_fraction))`` pairs to validation; both keep sorted order."""
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction: {val_fraction} is not between 0 and 1")
    if len(pairs) < 2:
        raise DatasetError(
            f"stereo-folder: {len(pairs)} stereo pair(s); need at least 2 to split into train and val"
        )
    chosen = np.random.default_rng(seed).permutation(len(pairs))[: max(1, round(len(pairs) * val_fraction))]
    chosen = set(chosen.tolist())
    if len(chosen) >= len(pairs):
        raise DatasetError(
            f"stereo-folder: val_fraction={val_fraction} leaves no training pair of {len(pairs)}"
        )
    return [p for i, p in enumerate(pairs) if i not in chosen], [
        p for i, p in enumerate(pairs) if i in chosen
    ]


# -------------------------------------------------------------------------------------------- decoding


def decode_rgb(raw: bytes, name: object = "image") -> np.ndarray:
    """An image's bytes as float32 RGB in [0, 1], H×W×3 (as :func:`tasks.stereo.io.read_image`)."""
    try:
        with Image.open(io.BytesIO(raw)) as image:
            return np.asarray(image.convert("RGB"), dtype=np.float32) / 255.0
    except Exception as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ValueError(f"{name}: cannot read as an image ({reason})") from None


def decode_disparity(raw: bytes, name: object = "disparity") -> tuple[np.ndarray, np.ndarray]:
    """(float32 disparity H×W, bool valid H×W) from a PFM's or a KITTI 16-bit PNG's bytes."""
    if raw[:2] in (b"PF", b"Pf"):
        disparity = parse_pfm(raw, name)
        if disparity.ndim == 3:  # some tools write disparity as a 3-channel PFM; the first is the value
            disparity = disparity[..., 0]
        return disparity, valid_disparity(disparity)
    return parse_kitti_disparity(raw, name)


def crop_box(height: int, width: int, crop: tuple[int, int]) -> tuple[slice, slice]:
    """The bottom-centre ``crop`` window of an H×W image (rows, columns)."""
    ch, cw = crop
    if ch > height or cw > width:
        raise ValueError(f"crop {ch}x{cw} is larger than the {height}x{width} image")
    left = (width - cw) // 2
    return slice(height - ch, height), slice(left, left + cw)


def stereo_sample(
    left: bytes,
    right: bytes,
    disparity: bytes,
    crop: tuple[int, int] | None = None,
    names: Pair | None = None,
    max_disparity: float | None = None,
) -> dict[str, torch.Tensor]:
    """A sample dict (see the module docstring) from the three files' bytes, cropped if ``crop``;
    ground truth above ``max_disparity`` (if given) is invalid too."""
    names = names or ("left", "right", "disparity")
    left_image, right_image = decode_rgb(left, names[0]), decode_rgb(right, names[1])
    disp, valid = decode_disparity(disparity, names[2])
    height, width = left_image.shape[:2]
    if right_image.shape != left_image.shape or disp.shape != (height, width):
        raise ValueError(
            f"{names[0]} is {width}x{height} but {names[1]} is {right_image.shape[1]}x{right_image.shape[0]} "
            f"and {names[2]} is {disp.shape[1]}x{disp.shape[0]}: all three must have one size"
        )
    if max_disparity is not None:
        valid = valid & valid_disparity(disp, max_disparity)
    if crop is not None:
        rows, cols = crop_box(height, width, crop)
        left_image, right_image = left_image[rows, cols], right_image[rows, cols]
        disp, valid = disp[rows, cols], valid[rows, cols]
    return {
        "left": torch.from_numpy(np.ascontiguousarray(left_image)).permute(2, 0, 1).contiguous(),
        "right": torch.from_numpy(np.ascontiguousarray(right_image)).permute(2, 0, 1).contiguous(),
        "disparity": torch.from_numpy(np.where(valid, disp, 0.0).astype(np.float32))[None],
        "valid": torch.from_numpy(np.ascontiguousarray(valid))[None],
    }


def default_crop(height: int, width: int, smallest: object) -> tuple[int, int]:
    """The largest multiples of :data:`STRIDE` within ``height`` × ``width``; DatasetError if none."""
    crop = (height // STRIDE * STRIDE, width // STRIDE * STRIDE)
    if min(crop) < STRIDE:
        raise DatasetError(
            f"stereo-folder: {smallest} is {width}x{height}: pairs must be at least {STRIDE}x{STRIDE} pixels"
        )
    return crop


def check_crop(crop: tuple[int, int], height: int, width: int, smallest: object) -> tuple[int, int]:
    """``crop`` as (h, w) if it is a positive multiple of STRIDE fitting every pair; else DatasetError."""
    ch, cw = (int(v) for v in crop)
    if ch < STRIDE or cw < STRIDE or ch % STRIDE or cw % STRIDE:
        raise DatasetError(
            f"stereo-folder: crop {ch}x{cw} (height x width) must be positive multiples of {STRIDE}"
        )
    if ch > height or cw > width:
        raise DatasetError(
            f"stereo-folder: crop {ch}x{cw} (height x width) is larger than {smallest} ({height}x{width})"
        )
    return ch, cw


# ----------------------------------------------------------------------------------------------- packing


@dataclass
class _Smallest:
    height: int
    width: int
    path: Path


class StereoSource:
    """Stereo pairs of one layout; ``load`` decodes and checks each pair once."""

    kind = "stereo-folder"
    classes: tuple[str, ...] = ()

    def __init__(self, layout: str, train: list[Pair], val: list[Pair]):
        self.layout, self.train, self.val = layout, train, val
        self.format = f"stereo/{layout}"
        self._smallest: _Smallest | None = None

    def load(self, ref: Pair) -> Loaded:
        blobs = []
        for path in ref:
            try:
                blobs.append(path.read_bytes())
            except OSError as exc:
                raise DatasetError(f"stereo-folder: cannot read {path} ({exc.strerror or exc})") from None
        try:
            left, right = decode_rgb(blobs[0], ref[0]), decode_rgb(blobs[1], ref[1])
            disp, valid = decode_disparity(blobs[2], ref[2])
        except ValueError as exc:
            raise DatasetError(f"stereo-folder: {exc}") from None
        height, width = left.shape[:2]
        if right.shape != left.shape:
            raise DatasetError(
                f"stereo-folder: {ref[1]} is {right.shape[1]}x{right.shape[0]} but {ref[0]} is {width}x{height}: "
                "left and right must have the same size"
            )
        if disp.shape != (height, width):
            raise DatasetError(
                f"stereo-folder: {ref[2]} is {disp.shape[1]}x{disp.shape[0]} but {ref[0]} is {width}x{height}"
            )
        if not valid.any():
            raise DatasetError(
                f"stereo-folder: {ref[2]} has no valid disparity (all zero, NaN, infinite or negative)"
            )
        smallest = self._smallest
        if smallest is None or height < smallest.height or width < smallest.width:
            self._smallest = _Smallest(
                min(height, smallest.height) if smallest else height,
                min(width, smallest.width) if smallest else width,
                ref[0],
            )
        return Loaded(
            ShardSample(0, tuple(blobs)), self.format, (height, width), BYTES_PER_PIXEL * height * width
        )

    def sample_shape(self, crop: tuple[int, int] | None = None) -> tuple[int, ...]:
        assert self._smallest is not None, "sample_shape before any pair was loaded"
        s = self._smallest
        if crop is not None:
            return check_crop(crop, s.height, s.width, s.path)
        return default_crop(s.height, s.width, s.path)


def stereo_source(path: Path, layout: str | None, seed: int, val_fraction: float) -> StereoSource:
    train, val = list_stereo(path, layout)
    if val is None:
        train, val = split_pairs(train, val_fraction, seed)
    return StereoSource(str(layout), train, val)
