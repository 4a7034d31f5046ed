"""A generated image-folder dataset in the real on-disk format (``<dir>/<class>/<n>.png``), for swarm
runs on an operator's data without downloading any: scikit-learn's 1,797 handwritten digits, each
drawn many times at 32x32 in RGB with its own shift, tint and noise, so the classes stay learnable
and no two files are the same.

    python -m testbed.image_folder OUT_DIR --images 50000
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image

__all__ = ["make_image_folder"]


def make_image_folder(root: Path, images: int, size: int = 32, seed: int = 0, progress=None) -> Path:
    """Write ``images`` PNG files under ``root/<digit>/``; returns ``root``. Deterministic in ``seed``."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    base = digits.images.astype(np.float32) / 16.0  # 8x8 in [0, 1]
    labels = digits.target
    rng = np.random.default_rng(seed)
    for c in range(10):
        (root / f"digit{c}").mkdir(parents=True, exist_ok=True)
    scale = max(1, size * 3 // 32)  # the digit drawn 3/4 of the image wide, then shifted at random
    for n in range(images):
        k = int(rng.integers(len(base)))
        glyph = np.kron(base[k], np.ones((scale, scale), dtype=np.float32))
        canvas = np.zeros((size, size), dtype=np.float32)
        top, left = (int(rng.integers(0, size - glyph.shape[0] + 1)) for _ in range(2))
        canvas[top : top + glyph.shape[0], left : left + glyph.shape[1]] = glyph
        tint = rng.uniform(0.4, 1.0, size=3).astype(np.float32)
        background = rng.uniform(0.0, 0.3, size=3).astype(np.float32)
        rgb = background + canvas[..., None] * (tint - background)
        rgb += rng.normal(0.0, 0.05, size=rgb.shape).astype(np.float32)
        pixels = (np.clip(rgb, 0.0, 1.0) * 255).astype(np.uint8)
        Image.fromarray(pixels).save(root / f"digit{labels[k]}" / f"{n:06d}.png")
        if progress is not None and (n + 1) % 1000 == 0:
            progress(n + 1, images)
    return root


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--images", type=int, default=50_000)
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.out.exists() and any(args.out.iterdir()):
        sys.exit(f"{args.out} is not empty")
    started = time.monotonic()

    def show(done: int, total: int) -> None:
        print(f"\r{done}/{total} images", end="", file=sys.stderr, flush=True)

    make_image_folder(args.out, args.images, args.size, args.seed, show)
    print(f"\n{args.images} images in {args.out} ({time.monotonic() - started:.0f} s)", file=sys.stderr)


if __name__ == "__main__":
    main()
