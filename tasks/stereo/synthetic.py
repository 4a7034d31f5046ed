"""Procedural stereo pairs with exact ground-truth disparity and true occlusions (no download).

A scene is a stack of layers seen by a rectified pair; disparity is left-referenced
(``left(x, y) = right(x - d(x, y), y)``). Every layer is a surface described in *right-image*
coordinates over an extended range ``x_r ∈ [-margin, W)``:

* its disparity ``d_k(x_r, y)`` is sampled at integer ``x_r`` and linear in between — a smooth random
  field (the background, bilinearly up-sampled from a coarse grid, optionally tilted) or a plane
  ``a + b·x + c·y`` (the foreground objects), so the scene is smooth or piecewise planar;
* its texture is sampled at integer ``x_r`` and linear in between (random colour, multi-octave value
  noise and per-pixel noise, so that matching is possible);
* its support is an interval per row (rectangles and ellipses).

The right view shows, at every integer ``x_r``, the covering layer with the largest disparity (the
nearest one). A left pixel ``x_l`` sees layer ``k`` at the ``x_r`` that solves ``x_r + d_k(x_r) = x_l``;
because ``x_r + d_k(x_r)`` is piecewise linear and strictly increasing, that inverse is exact. Among
the layers covering ``x_l`` the nearest wins; its ``x_l - x_r`` is the ground truth, and the left colour
is the layer texture at ``x_r`` (linear interpolation). A left pixel is **valid** when its surface point
is visible in the right view: both right pixels around ``x_r`` lie inside the image and show the same
layer. So on valid pixels, warping the right image by the ground truth (linear interpolation at
``x - d``) reproduces the left image exactly; occluded pixels and pixels that leave the right image are
invalid. Everything follows from ``numpy.random.default_rng`` on (seed, index): the same seed gives the
same pairs on every machine.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

__all__ = ["generate_pair", "SyntheticStereo"]


def _upsample(grid: np.ndarray, height: int, width: int) -> np.ndarray:
    """Bilinear up-sampling of a (C, h, w) grid to (C, height, width)."""
    t = torch.from_numpy(np.ascontiguousarray(grid, dtype=np.float32))[None]
    return F.interpolate(t, size=(height, width), mode="bilinear", align_corners=True)[0].double().numpy()


def _texture(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """A random colour texture (3, height, width) in [0, 1] with structure at several scales."""
    tex = rng.uniform(0.2, 0.8, size=(3, 1, 1)) * np.ones((3, height, width))
    amplitude = rng.uniform(0.15, 0.35)
    for cell in (16, 8, 4, 2):
        grid = rng.normal(size=(3 if rng.random() < 0.5 else 1, height // cell + 2, width // cell + 2))
        tex = tex + amplitude * _upsample(grid, height, width) * 0.5
        amplitude *= rng.uniform(0.6, 1.0)
    tex = tex + rng.uniform(0.05, 0.2) * rng.normal(size=(1, height, width))
    return np.clip(tex, 0.0, 1.0)


def _monotone(disp: np.ndarray, floor: float = 0.3) -> np.ndarray:
    """Scale a disparity field's variation about its mean so that x + d(x) rises by ≥ floor per pixel."""
    steepest = -np.min(np.diff(disp, axis=1), initial=0.0)
    if steepest <= 1.0 - floor:
        return disp
    mean = disp.mean()
    return mean + (disp - mean) * (1.0 - floor) / steepest


def _intervals(rng: np.random.Generator, height: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-row support [start, end] (right-image x, continuous) of a random rectangle or ellipse."""
    cx, cy = rng.uniform(0.05, 0.95) * width, rng.uniform(0.0, 1.0) * height
    rx = rng.uniform(0.06, 0.25) * width
    ry = rng.uniform(0.08, 0.35) * height
    dy = (np.arange(height) - cy) / ry
    inside = np.abs(dy) <= 1.0
    if rng.random() < 0.5:
        half = np.where(inside, rx, -1.0)
    else:
        half = np.where(inside, rx * np.sqrt(np.clip(1.0 - dy**2, 0.0, None)), -1.0)
    return cx - half, cx + half  # empty rows have start > end


def generate_pair(
    seed: int | np.random.SeedSequence,
    height: int = 64,
    width: int = 128,
    max_disparity: float = 24.0,
    objects: tuple[int, int] = (2, 5),
) -> dict[str, torch.Tensor]:
    """One stereo pair: ``left``/``right`` (3×H×W float32 in [0, 1]), ``disparity`` (1×H×W float32,
    left-referenced, in pixels, within [0, max_disparity]) and ``valid`` (1×H×W bool, False where the
    left pixel is occluded in or leaves the right view)."""
    if height < 2 or width < 2:
        raise ValueError(f"image size must be at least 2x2, got {height}x{width}")
    if not max_disparity > 0:
        raise ValueError(f"max_disparity must be positive, got {max_disparity}")
    rng = np.random.default_rng(seed)
    margin = int(math.ceil(max_disparity)) + 2
    span = width + margin  # extended right-image x: -margin .. width-1
    xs = np.arange(span, dtype=np.float64) - margin
    ys = np.arange(height, dtype=np.float64)[:, None]

    # Background: a smooth random field (optionally tilted) in the lower part of the range.
    lo, hi = sorted(rng.uniform(0.0, 0.6 * max_disparity, size=2))
    coarse = rng.uniform(lo, hi + 0.1 * max_disparity, size=(1, rng.integers(2, 5), rng.integers(2, 6)))
    bg = _upsample(coarse, height, span)[0]
    if rng.random() < 0.5:
        bg = bg + rng.uniform(-0.15, 0.15) * max_disparity * (ys / height - 0.5)
    layers = [(_monotone(np.clip(bg, 0.0, max_disparity)), _texture(rng, height, span), None)]

    # Foreground: planes on rectangles and ellipses, nearer than most of the background.
    for _ in range(rng.integers(objects[0], objects[1] + 1)):
        start, end = _intervals(rng, height, width)
        centre = rng.uniform(0.3, 1.0) * max_disparity
        slope_x, slope_y = rng.uniform(-0.2, 0.2, size=2) * max_disparity / np.array([width, height])
        plane = centre + slope_x * (xs[None, :] - 0.5 * width) + slope_y * (ys - 0.5 * height)
        layers.append(
            (_monotone(np.clip(plane, 0.0, max_disparity)), _texture(rng, height, span), (start, end))
        )

    def covers(support, x):
        if support is None:
            return np.ones(x.shape, dtype=bool)
        start, end = support
        return (x >= start[:, None]) & (x <= end[:, None])

    # Right view: nearest covering layer at every integer x_r in [0, width).
    right_x = np.broadcast_to(np.arange(width, dtype=np.float64), (height, width))
    depth = np.stack([np.where(covers(s, right_x), d[:, margin:], -np.inf) for d, _, s in layers])
    right_layer = depth.argmax(axis=0)
    textures = np.stack([t[:, :, margin:] for _, t, _ in layers])  # K, 3, H, W
    right = np.take_along_axis(textures, right_layer[None, None], axis=0)[0]

    # Left view: invert x_r + d_k(x_r) = x_l per layer and row (exact on the piecewise-linear field).
    left_x = np.broadcast_to(np.arange(width, dtype=np.float64), (height, width))
    candidates = []
    for d, tex, support in layers:
        f = xs[None, :] + d  # strictly increasing along each row
        offset = (np.arange(height) * (4.0 * (span + max_disparity)))[:, None]
        j = np.searchsorted((f + offset).ravel(), (left_x + offset).ravel(), side="right").reshape(
            height, width
        )
        j = j - np.arange(height)[:, None] * span - 1
        inside = (j >= 0) & (j < span - 1)
        j = np.clip(j, 0, span - 2)
        f0 = np.take_along_axis(f, j, axis=1)
        f1 = np.take_along_axis(f, j + 1, axis=1)
        t = (left_x - f0) / (f1 - f0)
        x_r = xs[j] + t
        colour = (1 - t) * np.take_along_axis(tex, np.broadcast_to(j, (3, height, width)), axis=2) + t * (
            np.take_along_axis(tex, np.broadcast_to(j + 1, (3, height, width)), axis=2)
        )
        seen = inside & covers(support, x_r)
        candidates.append((np.where(seen, left_x - x_r, -np.inf), x_r, colour))
    left_disp = np.stack([c[0] for c in candidates])
    left_layer = left_disp.argmax(axis=0)
    disparity = np.take_along_axis(left_disp, left_layer[None], axis=0)[0]
    x_r = np.take_along_axis(np.stack([c[1] for c in candidates]), left_layer[None], axis=0)[0]
    left = np.take_along_axis(np.stack([c[2] for c in candidates]), left_layer[None, None], axis=0)[0]

    # Valid: the left pixel's surface point is visible in the right view (both neighbours, same layer).
    lower = np.floor(x_r + 1e-9)
    upper = np.where(x_r - lower > 1e-6, lower + 1, lower)
    in_view = (lower >= 0) & (upper <= width - 1)
    rows = np.arange(height)[:, None]
    lo_i = np.clip(lower, 0, width - 1).astype(np.int64)
    hi_i = np.clip(upper, 0, width - 1).astype(np.int64)
    visible = (right_layer[rows, lo_i] == left_layer) & (right_layer[rows, hi_i] == left_layer)
    valid = in_view & visible

    return {
        "left": torch.from_numpy(left.astype(np.float32)),
        "right": torch.from_numpy(right.astype(np.float32)),
        "disparity": torch.from_numpy(disparity.astype(np.float32))[None],
        "valid": torch.from_numpy(valid)[None],
    }


class SyntheticStereo(Dataset):
    """``length`` procedural stereo pairs; item ``i`` depends only on (seed, i), so any shard, order or
    worker sees the same pair. ``cache=True`` keeps generated pairs in memory."""

    def __init__(
        self,
        length: int,
        height: int = 64,
        width: int = 128,
        max_disparity: float = 24.0,
        seed: int = 0,
        cache: bool = False,
    ):
        if length < 0:
            raise ValueError(f"length must be non-negative, got {length}")
        self.length, self.height, self.width = int(length), int(height), int(width)
        self.max_disparity, self.seed = float(max_disparity), int(seed)
        self._cache: dict[int, dict[str, torch.Tensor]] | None = {} if cache else None

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if not -self.length <= index < self.length:
            raise IndexError(f"index {index} out of range for {self.length} pairs")
        index %= self.length
        if self._cache is not None and index in self._cache:
            return self._cache[index]
        pair = generate_pair(
            np.random.SeedSequence([self.seed, index]), self.height, self.width, self.max_disparity
        )
        if self._cache is not None:
            self._cache[index] = pair
        return pair
