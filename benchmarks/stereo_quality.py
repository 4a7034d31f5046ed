"""Stereo supernet quality on ``stereo-synthetic`` within a CPU training-time budget, and the
correlation layer's speed against a per-displacement loop.

1. **Correlation speed**: :func:`supernet.stereo.correlation.correlation_1d` (all-pairs matrix
   product + gather) against :func:`supernet.stereo.correlation.correlation_1d_loop` (one slice
   product per displacement), forward and forward + backward, median of repeated runs, at the
   shapes the benchmark model uses and at the DispNetC shape (128 channels, 1/4 of 384×768,
   D = 40); side by side with the ratio.
2. **Quality**: trains a ``StereoSupernet`` with the single-process stereo recipe
   (``supernet.stereo_training.train_stereo``: sandwich rule, in-place distillation from the largest
   sub-network, AdamW with warm-up + cosine), then evaluates the largest, the smallest and two random
   sub-networks after BN recalibration, inside the supernet and as exported standalone models.
   Targets (issue 8): the largest sub-network's validation EPE ≤ ½ × the EPE of always predicting
   the mean training disparity, and the smallest's EPE ≤ 1.3 × the largest's.

The number of steps is fitted to the budget as in ``benchmarks/ofa_quality.py``: a short probe (a
throw-away supernet, same settings) measures seconds per step now, and the run uses
``0.9 × budget / (s/step)`` steps, with a hard stop at the budget in case the machine slows down.

    .venv/bin/python -m benchmarks.stereo_quality                # 10-minute budget
    .venv/bin/python -m benchmarks.stereo_quality --budget 60    # a quick look
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch

from supernet.stereo.correlation import correlation_1d, correlation_1d_loop
from supernet.stereo_training import (
    StereoTrainConfig,
    accumulate_stereo_gradients,
    build_stereo_supernet,
    evaluate_stereo_subnets,
    make_optimizer,
    mean_disparity_baseline,
    optimizer_step,
    step_configs,
    stereo_batch,
    train_stereo,
)
from tasks import get_task


def load() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "n/a"


def _time(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def _measure(fn, left, right, displacement: int, repeats: int) -> tuple[float, float]:
    """Median milliseconds of ``fn``'s forward pass, and of forward + backward."""

    def forward():
        with torch.no_grad():
            fn(left, right, displacement)

    def forward_backward():
        out = fn(left, right, displacement)
        out.backward(torch.ones_like(out))

    return 1000 * _time(forward, repeats), 1000 * _time(forward_backward, repeats)


def correlation_speed(shapes, repeats: int) -> list[dict]:
    rows = []
    for batch, channels, height, width, displacement in shapes:
        g = torch.Generator().manual_seed(0)
        left = torch.randn(batch, channels, height, width, generator=g, requires_grad=True)
        right = torch.randn(batch, channels, height, width, generator=g, requires_grad=True)
        row = {"shape": f"{batch}x{channels}x{height}x{width}", "D": displacement}
        for name, fn in (("vectorised", correlation_1d), ("loop", correlation_1d_loop)):
            row[f"{name}_fwd_ms"], row[f"{name}_fwdbwd_ms"] = _measure(fn, left, right, displacement, repeats)
        with torch.no_grad():
            fast = correlation_1d(left, right, displacement)
            row["max_abs_diff"] = (fast - correlation_1d_loop(left, right, displacement)).abs().max().item()
        rows.append(row)
    return rows


def seconds_per_step(cfg: StereoTrainConfig, task, steps: int = 4) -> float:
    """Time a few whole training steps of a throw-away supernet with the same settings."""
    net = build_stereo_supernet(cfg)
    optimizer = make_optimizer(net, cfg)
    started = 0.0
    for step in range(steps + 1):
        if step == 1:
            started = time.perf_counter()  # step 0 is a warm-up
        batch = stereo_batch(task.train_set, range(step * cfg.batch_size, (step + 1) * cfg.batch_size))
        accumulate_stereo_gradients(net, batch, step_configs(net, step, cfg), cfg)
        optimizer_step(net, optimizer, step, cfg)
    return (time.perf_counter() - started) / steps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--budget", type=float, default=600.0, help="training seconds (default 600)")
    parser.add_argument("--steps", type=int, default=None, help="fixed number of steps (skips the probe)")
    parser.add_argument("--max-steps", type=int, default=3000)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1: the CPU is shared)")
    parser.add_argument("--height", type=int, default=64)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--max-disparity", type=float, default=24.0)
    parser.add_argument("--widths", default="8,16,24,32,48,64", help="the 6 unit widths")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--num-subnets", type=int, default=3)
    parser.add_argument("--lr", type=float, default=5e-3)
    parser.add_argument("--distill-weight", type=float, default=0.5)
    parser.add_argument("--no-fine-correlation", action="store_true")
    parser.add_argument("--corr-repeats", type=int, default=10)
    parser.add_argument("--skip-correlation", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    out: dict = {"load_before": load(), "threads": args.threads, "command": " ".join(sys.argv)}
    print(f"load average before: {out['load_before']}; torch threads: {args.threads}")

    if not args.skip_correlation:
        d8 = max(1, math.ceil(args.max_disparity / 8))  # the benchmark model's displacements
        d4 = 2 * d8  # (at 1/8 and, the fine correlation, at 1/4)
        widths = [int(w) for w in args.widths.split(",")]
        shapes = [
            (args.batch_size, widths[2], args.height // 8, args.width // 8, d8),  # 1/8, as in the model
            (args.batch_size, widths[1], args.height // 4, args.width // 4, d4),  # 1/4, as in the model
            (1, 128, 96, 192, 40),  # DispNetC: conv2 of a 384×768 pair
            (4, 64, 64, 128, 32),  # a larger batch at 1/4 of 256×512
        ]
        rows = correlation_speed(shapes, args.corr_repeats)
        out["correlation"] = rows
        print(
            "\ncorrelation (median ms)      vectorised fwd / fwd+bwd      loop fwd / fwd+bwd     speed-up fwd / fwd+bwd"
        )
        for r in rows:
            print(
                f"  {r['shape']:>14} D={r['D']:<3}  {r['vectorised_fwd_ms']:9.2f} / {r['vectorised_fwdbwd_ms']:8.2f}"
                f"   {r['loop_fwd_ms']:9.2f} / {r['loop_fwdbwd_ms']:8.2f}"
                f"   {r['loop_fwd_ms'] / r['vectorised_fwd_ms']:6.1f}× / "
                f"{r['loop_fwdbwd_ms'] / r['vectorised_fwdbwd_ms']:5.1f}×   (max |Δ| {r['max_abs_diff']:.1e})"
            )

    task = get_task(
        "stereo-synthetic",
        height=args.height,
        width=args.width,
        max_disparity=args.max_disparity,
        seed=args.seed,
        val_size=128,
    )
    base = dict(
        seed=args.seed,
        unit_channels=tuple(int(w) for w in args.widths.split(",")),
        batch_size=args.batch_size,
        num_subnets=args.num_subnets,
        lr=args.lr,
        distill_weight=args.distill_weight,
        fine_correlation=not args.no_fine_correlation,
        max_displacement=max(1, math.ceil(args.max_disparity / 8)),  # covers max_disparity at 1/8
        log_every=25,
        eval_random_subnets=2,
    )
    if args.steps is None:
        probe = seconds_per_step(StereoTrainConfig(total_steps=100, **base), task)
        steps = max(20, min(args.max_steps, int(0.9 * args.budget / probe)))
        print(f"\nprobe: {probe:.2f} s/step → {steps} steps for a {args.budget:.0f} s budget")
        out["probe_seconds_per_step"] = probe
    else:
        steps = args.steps
    cfg = StereoTrainConfig(total_steps=steps, warmup_steps=min(20, steps // 10), **base)
    out["config"] = cfg.to_dict()

    baseline = mean_disparity_baseline(task)
    print(
        f"mean-disparity baseline: predicting {baseline['mean_disparity']:.2f} px everywhere gives "
        f"validation EPE {baseline['epe']:.3f}"
    )
    cpu_started = time.process_time()
    result = train_stereo(cfg, task, progress=print, max_seconds=args.budget, final_eval=False)
    cpu_seconds = time.process_time() - cpu_started
    # every evaluated sub-network also as an exported standalone model (after its BN recalibration)
    rows = evaluate_stereo_subnets(result["net"], task, cfg, export=True)
    largest = next(r for r in rows if r["name"] == "largest")
    smallest = next(r for r in rows if r["name"] == "smallest")
    ok_largest = largest["epe"] <= 0.5 * baseline["epe"]
    ok_smallest = smallest["epe"] <= 1.3 * largest["epe"]
    out.update(
        baseline=baseline,
        rows=rows,
        steps=result["steps"],
        train_seconds=result["seconds"],
        train_cpu_seconds=cpu_seconds,
        train_macs=result["train_macs"],
        load_after=load(),
        targets={"largest<=0.5*baseline": ok_largest, "smallest<=1.3*largest": ok_smallest},
    )
    print(
        f"\ntrained {result['steps']} steps in {result['seconds']:.0f} s wall, {cpu_seconds:.0f} s CPU "
        f"({result['train_macs'] / 1e12:.2f} T multiply-adds credited); load average after: {out['load_after']}"
    )
    print(
        f"{'sub-network':<10} {'MMACs':>8} {'params':>8} {'EPE':>7} {'bad1':>6} {'bad3':>6} {'D1':>6} {'exported EPE':>13}"
    )
    for r in rows:
        exported = f"{r['exported_epe']:.3f}"
        print(
            f"{r['name']:<10} {r['macs'] / 1e6:8.1f} {r['params']:8d} {r['epe']:7.3f} {100 * r['bad1']:5.1f}%"
            f" {100 * r['bad3']:5.1f}% {100 * r['d1']:5.1f}% {exported:>13}"
        )
    print(
        f"mean-disp. {'':>8} {'':>8} {baseline['epe']:7.3f} {100 * baseline['bad1']:5.1f}% {100 * baseline['bad3']:5.1f}%"
    )
    print(
        f"\ntarget largest EPE ≤ ½ baseline: {largest['epe']:.3f} ≤ {0.5 * baseline['epe']:.3f} "
        f"({largest['epe'] / baseline['epe']:.2f}× baseline): {'PASS' if ok_largest else 'FAIL'}"
    )
    print(
        f"target smallest EPE ≤ 1.3 × largest: {smallest['epe']:.3f} ≤ {1.3 * largest['epe']:.3f} "
        f"({smallest['epe'] / largest['epe']:.2f}×): {'PASS' if ok_smallest else 'FAIL'}"
    )
    if args.json:
        args.json.write_text(json.dumps(out, indent=2, default=str))
    return 0 if ok_largest and ok_smallest else 1


if __name__ == "__main__":
    sys.exit(main())
