"""The latency model: a measured lookup table per device, built once per supernet and reused.

**What is measured.** Every elastic block choice, alone, at the shape it sees in the network at the
task's resolution and batch size 1: for each unit, its first block (which changes width and
resolution) and its later blocks (which all have the same shape, so one entry serves them all), for
every kernel size × expand ratio. A block is timed as the plain-torch module the export produces, so
the table describes what is deployed. Input shapes are recorded by running the supernet once with
hooks on its units, which works the same for the classification and the stereo supernets.

**The prediction** is ``fixed_ms + scale × (sum of the active blocks' entries)``. ``fixed_ms`` is
what does not depend on the sub-network (stem, head, correlation, decoder, call overhead); ``scale``
is the slow-down of blocks running inside a network compared with alone (alone, a block's weights
and input stay in cache between repeats; end to end they are evicted by the other blocks). Both are
fitted by least squares to the end-to-end time of a few calibration sub-networks (the largest, the
smallest and some random ones, fixed by a seed), which are not the ones :func:`validate` checks
against.

**Reuse.** The table is JSON. Its ``key`` is a SHA-256 of the supernet's architecture (its module
``repr``), the input size, the device and its hardware name, the thread count and the torch version;
a stored table is reused exactly when the key matches, and rebuilt otherwise.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch
from torch import nn

from supernet.config import SearchSpace, SubnetConfig, derive_seed
from supernet.search.timing import device_name, example_inputs, interleaved_median_ms, torch_threads

__all__ = [
    "LatencyTable",
    "LatencyTableError",
    "build_latency_table",
    "entry_key",
    "latency_key",
    "load_or_build",
    "mean_abs_pct_error",
    "measure_model",
    "measure_models",
    "unit_shapes",
    "validate",
]

FORMAT = "manta-latency-table"
VERSION = 1


class LatencyTableError(ValueError):
    """A file that should be a latency table is not one (one line saying why)."""


def entry_key(unit: int, block: int, kernel_size: int, expand_ratio: float) -> str:
    """The table entry of block ``block`` of ``unit``: blocks after the first share one entry."""
    return f"u{unit}.b{0 if block == 0 else 1}.k{kernel_size}.e{expand_ratio:g}"


@dataclass
class LatencyTable:
    """Measured block latencies (ms) of one supernet on one device, and the end-to-end calibration."""

    key: str
    device: str
    entries: dict[str, float]
    fixed_ms: float
    scale: float
    meta: dict[str, Any] = field(default_factory=dict)

    def blocks_ms(self, cfg: SubnetConfig) -> float:
        """Sum of the table entries of ``cfg``'s active blocks."""
        try:
            return sum(self.entries[entry_key(u, b, k, e)] for u, b, k, e in cfg.blocks())
        except KeyError as e:
            raise ValueError(f"config: block choice {e.args[0]} is not in the latency table") from None

    def predict(self, cfg: SubnetConfig) -> float:
        """Predicted end-to-end latency of ``cfg`` in milliseconds (batch 1)."""
        return self.fixed_ms + self.scale * self.blocks_ms(cfg)

    def cheapest(self, space: SearchSpace) -> SubnetConfig:
        """The sub-network with the lowest predicted latency (exact: the prediction is a sum per block).

        Measured entries need not be monotone (a 5×5 kernel can time faster than a 3×3), so this is
        not simply the smallest config: per unit, the best depth given the fastest choice per block.
        """
        depths, kernels, expands = [], [], []
        for u in range(space.num_units):
            best = None
            for d in space.depths:
                choices = [
                    min(
                        ((k, e) for k in space.kernel_sizes for e in space.expand_ratios),
                        key=lambda ke, b=b: self.entries[entry_key(u, b, *ke)],
                    )
                    for b in range(d)
                ]
                total = sum(self.entries[entry_key(u, b, k, e)] for b, (k, e) in enumerate(choices))
                if best is None or total < best[0]:
                    best = (total, d, choices)
            _, d, choices = best
            depths.append(d)
            kernels.append([k for k, _ in choices])
            expands.append([e for _, e in choices])
        return SubnetConfig(depths, kernels, expands)

    # ---- JSON -----------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": VERSION,
            "key": self.key,
            "device": self.device,
            "fixed_ms": self.fixed_ms,
            "scale": self.scale,
            "entries": dict(sorted(self.entries.items())),
            **self.meta,
        }

    def save(self, path: str | Path) -> Path:
        """Write the table as JSON (to a temporary name, then renamed: readers never see half a file)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=1) + "\n", encoding="utf-8")
        os.replace(tmp, path)
        return path

    @classmethod
    def load(cls, path: str | Path) -> LatencyTable:
        path = Path(path)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise LatencyTableError(f"{path} is not a readable latency table ({type(e).__name__})") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise LatencyTableError(f"{path} is not a MANTA latency table")
        if data.get("version") != VERSION:
            raise LatencyTableError(f"{path} is latency-table version {data.get('version')!r}, not {VERSION}")
        try:
            meta = {k: v for k, v in data.items() if k not in {"format", "version", "key", "device",
                                                              "fixed_ms", "scale", "entries"}}  # fmt: skip
            return cls(
                str(data["key"]),
                str(data["device"]),
                {str(k): float(v) for k, v in data["entries"].items()},
                float(data["fixed_ms"]),
                float(data["scale"]),
                meta,
            )
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise LatencyTableError(f"{path}: malformed latency table ({type(e).__name__}: {e})") from None


# --------------------------------------------------------------------------------------------------
# Building
# --------------------------------------------------------------------------------------------------


def latency_key(
    net: nn.Module, family: str, input_size: Sequence[int], device: torch.device, threads: int
) -> str:
    """What a table is valid for: architecture, input size, device (and its hardware), threads, torch."""

    payload = json.dumps(
        [repr(net), family, list(input_size), device.type, device_name(device), threads, 1, torch.__version__]
    )
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


def unit_shapes(
    net: nn.Module, inputs: tuple[torch.Tensor, ...]
) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """(input shape, output shape) of every unit when the largest sub-network runs on ``inputs``."""
    shapes: dict[int, list] = {}
    hooks = []
    for u, unit in enumerate(net.units):
        hooks.append(
            unit.register_forward_pre_hook(
                lambda m, a, u=u: shapes.setdefault(u, [None, None]).__setitem__(0, tuple(a[0].shape))
            )
        )  # noqa: E501
        hooks.append(
            unit.register_forward_hook(lambda m, a, o, u=u: shapes[u].__setitem__(1, tuple(o.shape)))
        )
    previous, was_training = net.active, net.training
    try:
        net.set_active(net.largest_config())
        net.eval()
        with torch.inference_mode():
            net(*inputs)
    finally:
        for h in hooks:
            h.remove()
        net.set_active(previous)
        net.train(was_training)
    return [tuple(shapes[u]) for u in range(len(net.units))]


def measure_models(
    models: Sequence[nn.Module],
    inputs: tuple[torch.Tensor, ...],
    device: torch.device,
    warmup: int = 10,
    repeats: int = 50,
) -> list[float]:
    """End-to-end latency (median ms, batch 1) of each standalone model on ``device``, timed
    interleaved (see :func:`~supernet.search.timing.interleaved_median_ms`)."""
    inputs = tuple(x.to(device) for x in inputs)
    fns = {}
    for i, model in enumerate(models):
        model = model.to(device).eval()
        fns[str(i)] = lambda m=model: m(*inputs)
    times = interleaved_median_ms(fns, device, warmup, repeats)
    return [times[str(i)] for i in range(len(models))]


def measure_model(
    model: nn.Module,
    inputs: tuple[torch.Tensor, ...],
    device: torch.device,
    warmup: int = 10,
    repeats: int = 50,
) -> float:
    """End-to-end latency (median ms) of one standalone ``model`` on ``device`` at batch 1."""
    return measure_models([model], inputs, device, warmup, repeats)[0]


def calibration_configs(space: SearchSpace, count: int, seed: int = 0) -> list[SubnetConfig]:
    """The largest, the smallest and ``count - 2`` random sub-networks (fixed by ``seed``)."""
    rng = random.Random(derive_seed("latency-calibration", seed))
    configs = [space.largest(), space.smallest()]
    configs += [space.sample(rng) for _ in range(max(0, count - 2))]
    return configs[: max(2, count)]


def _fit(blocks: Sequence[float], measured: Sequence[float]) -> tuple[float, float]:
    """Least-squares ``measured ≈ fixed + scale × blocks`` with ``fixed >= 0`` and ``scale > 0``."""
    n = len(blocks)
    mx, my = sum(blocks) / n, sum(measured) / n
    var = sum((x - mx) ** 2 for x in blocks)
    if var > 0:
        scale = sum((x - mx) * (y - my) for x, y in zip(blocks, measured, strict=True)) / var
        fixed = my - scale * mx
        if scale > 0 and fixed >= 0:
            return fixed, scale
    # Through the origin (no fixed part) when the free fit is not physical.
    scale = sum(x * y for x, y in zip(blocks, measured, strict=True)) / max(sum(x * x for x in blocks), 1e-12)
    return 0.0, max(scale, 1e-6)


def build_latency_table(
    net: nn.Module,
    family: str,
    input_size: Sequence[int],
    device: torch.device,
    *,
    threads: int = 1,
    warmup: int = 10,
    repeats: int = 50,
    calibration: int = 6,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
    meta: dict[str, Any] | None = None,
) -> LatencyTable:
    """Time every block choice of ``net`` on ``device`` and calibrate against end-to-end timings.

    Runs with ``threads`` torch threads (restored afterwards). ``net`` is not changed (its active
    sub-network and mode are restored).
    """
    started = time.perf_counter()
    say = progress or (lambda line: None)
    space: SearchSpace = net.space
    with torch_threads(threads):
        own_device = next(net.parameters()).device
        shapes = unit_shapes(net, example_inputs(family, tuple(input_size), own_device))
        generator = torch.Generator().manual_seed(0)
        fns: dict[str, Callable[[], object]] = {}
        for u, unit in enumerate(net.units):
            slots = [0] if space.max_depth == 1 else [0, 1]
            for b in slots:
                shape = shapes[u][0] if b == 0 else shapes[u][1]
                x = torch.rand(*shape, generator=generator).to(device)
                for k in space.kernel_sizes:
                    for e in space.expand_ratios:
                        block = unit.blocks[b].export(k, e).to(device).eval()
                        fns[entry_key(u, b, k, e)] = lambda blk=block, x=x: blk(x)
        entries = interleaved_median_ms(fns, device, warmup, repeats)
        say(f"latency table: timed {len(entries)} block choices on {device.type}")
        configs = calibration_configs(space, calibration, seed)
        inputs = example_inputs(family, tuple(input_size), device)
        measured = measure_models([net.export(cfg) for cfg in configs], inputs, device, warmup, repeats)
        blocks = LatencyTable("", device.type, entries, 0.0, 1.0)
        rows = [
            {"config": cfg.to_json(), "blocks_ms": blocks.blocks_ms(cfg), "measured_ms": ms}
            for cfg, ms in zip(configs, measured, strict=True)
        ]
        fixed, scale = _fit([r["blocks_ms"] for r in rows], [r["measured_ms"] for r in rows])
    info = {
        "device_name": device_name(device),
        "threads": threads,
        "batch": 1,
        "torch": torch.__version__,
        "family": family,
        "input_size": list(input_size),
        "warmup": warmup,
        "repeats": repeats,
        "calibration": rows,
        "built_seconds": round(time.perf_counter() - started, 3),
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        **(meta or {}),
    }
    key = latency_key(net, family, input_size, device, threads)
    return LatencyTable(key, device.type, entries, fixed, scale, info)


def load_or_build(
    path: str | Path,
    net: nn.Module,
    family: str,
    input_size: Sequence[int],
    device: torch.device,
    *,
    threads: int = 1,
    **build_options: Any,
) -> tuple[LatencyTable, str]:
    """The table at ``path`` if it was made for this supernet, device and thread count, else a new one
    (saved there). Returns ``(table, how)`` with ``how`` one of ``"reused"``, ``"built"``, ``"rebuilt"``.

    A file at ``path`` that is not a latency table raises :class:`LatencyTableError` (never overwritten).
    """
    path = Path(path)
    how = "built"
    if path.exists():
        table = LatencyTable.load(path)
        if table.key == latency_key(net, family, input_size, device, threads):
            return table, "reused"
        how = "rebuilt"
    table = build_latency_table(net, family, input_size, device, threads=threads, **build_options)
    table.save(path)
    return table, how


# --------------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------------


def validate(
    table: LatencyTable,
    net: nn.Module,
    family: str,
    input_size: Sequence[int],
    device: torch.device,
    configs: Sequence[SubnetConfig],
    *,
    threads: int = 1,
    warmup: int = 10,
    repeats: int = 50,
) -> list[dict[str, Any]]:
    """Predicted against measured end-to-end latency of the exported ``configs``: one row each with
    ``hash``, ``predicted_ms``, ``measured_ms`` and ``error_pct`` (signed, relative to measured)."""
    with torch_threads(threads):
        inputs = example_inputs(family, tuple(input_size), device)
        measured = measure_models([net.export(cfg) for cfg in configs], inputs, device, warmup, repeats)
    rows = []
    for cfg, ms in zip(configs, measured, strict=True):
        predicted = table.predict(cfg)
        rows.append(
            {
                "hash": cfg.hash,
                "config": str(cfg),
                "predicted_ms": predicted,
                "measured_ms": ms,
                "error_pct": 100.0 * (predicted - ms) / ms,
            }
        )
    return rows


def mean_abs_pct_error(rows: Sequence[dict[str, Any]]) -> float:
    """Mean absolute percentage error of :func:`validate` rows."""
    if not rows:
        raise ValueError("rows: nothing to average")
    return sum(abs(r["error_pct"]) for r in rows) / len(rows)
