"""Classification supernet quality on ``digits`` within a training-time budget.

Trains a ``ClassificationSupernet`` with the single-process recipe (``supernet.training.loop.train``), then
evaluates the largest, the smallest and a few random sub-networks after BN recalibration, inside the
supernet and as exported standalone models (the largest and smallest also after a TorchScript
save/load round trip). No fine-tuning. Targets (issue 4): largest ≥ 97 %, smallest ≥ 93 % validation
accuracy, exported models scoring the same.

The number of steps is fitted to the budget: a short probe (a throw-away supernet, same settings)
measures seconds per step on this machine now, and the run uses ``0.85 × budget / (s/step)`` steps
(capped by ``--max-steps``), so the cosine schedule completes inside the budget.

    .venv/bin/python -m benchmarks.ofa_quality                 # 10-minute budget
    .venv/bin/python -m benchmarks.ofa_quality --budget 60     # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

from supernet import save_torchscript
from supernet.training.batches import training_batch
from supernet.training.build import build_supernet
from supernet.training.config import TrainConfig
from supernet.training.evaluation import evaluate, evaluate_subnets, recalibrate_for_evaluation
from supernet.training.gradients import accumulate_gradients
from supernet.training.loop import train
from supernet.training.optimizer import make_optimizer, optimizer_step
from supernet.training.schedule import step_configs
from tasks import get_task, shard_indices


def load() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "n/a"


def seconds_per_step(cfg: TrainConfig, task, steps: int = 5) -> float:
    """Time a few whole training steps (data, K sub-networks forward and backward, optimizer step)
    of a throw-away supernet with the same settings."""
    net = build_supernet(cfg, task.num_classes, task.input_size[0])
    optimizer = make_optimizer(net, cfg)
    generator = torch.Generator().manual_seed(cfg.seed)  # augmentation draws, as train() makes them
    started = 0.0
    for step in range(steps + 1):
        if step == 1:
            started = time.perf_counter()  # step 0 is a warm-up
        indices = shard_indices(len(task.train_set), cfg.seed, step, ["probe"], "probe", cfg.batch_size)
        inputs, targets = training_batch(task, indices, generator)
        configs = step_configs(net, step, cfg)
        accumulate_gradients(net, inputs, targets, configs, cfg, task.loss, generator=generator)
        optimizer_step(net, optimizer, step, cfg)
    return (time.perf_counter() - started) / steps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--budget", type=float, default=600.0, help="training seconds (default 600)")
    parser.add_argument("--max-steps", type=int, default=2000)
    parser.add_argument("--steps", type=int, default=None, help="fixed number of steps (skips the probe)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1: the CPU is shared)")
    parser.add_argument("--width-mult", type=float, default=0.5)
    parser.add_argument("--head-channels", type=int, default=256)
    parser.add_argument("--schedule", choices=("sandwich", "progressive"), default="sandwich")
    parser.add_argument("--num-subnets", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    say = lambda line: print(line, flush=True)  # noqa: E731
    say(f"load average at start: {load()} ({os.cpu_count()} CPUs, torch threads {torch.get_num_threads()})")
    task = get_task("digits")
    settings = dict(
        width_mult=args.width_mult,
        head_channels=args.head_channels,
        schedule=args.schedule,
        num_subnets=args.num_subnets,
        batch_size=args.batch_size,
        lr=args.lr,
        seed=args.seed,
        warmup_steps=10,
        label_smoothing=0.1,
        bn_calibration_batches=16,
        eval_random_subnets=3,
        log_every=25,
    )
    if args.steps is None:
        probe = seconds_per_step(TrainConfig(total_steps=100, **settings), task)
        steps = max(20, min(args.max_steps, int(0.85 * args.budget / probe)))
        say(f"probe: {probe:.2f} s/step -> {steps} steps for a {args.budget:.0f} s budget")
    else:
        steps = args.steps
    cfg = TrainConfig(total_steps=steps, **settings)
    say(f"training {task} with {json.dumps(cfg.to_dict())}")
    result = train(cfg, task, progress=say)
    net = result["net"]
    rows = evaluate_subnets(net, task, cfg, export=True)
    # The largest and smallest once more as files: TorchScript save -> load -> evaluate.
    with tempfile.TemporaryDirectory() as tmp:
        for row in rows[:2]:
            cfg_ = net.largest_config() if row["name"] == "largest" else net.smallest_config()
            recalibrate_for_evaluation(net, cfg_, task, cfg)
            path = save_torchscript(net.export(cfg_), Path(tmp) / f"{row['name']}.pt")
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)  # torch.jit is deprecated, still works
                loaded = torch.jit.load(str(path))
            row["torchscript_accuracy"] = evaluate(loaded, task.val_set, task.metric)
    say(f"load average at end: {load()}")
    say("")
    say(f"trained {steps} steps in {result['seconds']:.0f} s ({result['seconds'] / steps:.2f} s/step), "
        f"{result['train_macs'] / 1e12:.2f} TMACs credited")  # fmt: skip
    say(f"{'sub-network':<10} {'MMACs':>7} {'params':>8} {'supernet':>9} {'exported':>9} {'torchscript':>11}")
    for row in rows:
        ts = f"{100 * row['torchscript_accuracy']:.2f}%" if "torchscript_accuracy" in row else "-"
        say(
            f"{row['name']:<10} {row['macs'] / 1e6:7.2f} {row['params']:8d} {100 * row['accuracy']:8.2f}% "
            f"{100 * row['exported_accuracy']:8.2f}% {ts:>11}"
        )
    largest, smallest = rows[0]["accuracy"], rows[1]["accuracy"]
    same = all(abs(r["accuracy"] - r["exported_accuracy"]) < 1e-9 for r in rows) and all(
        abs(r["accuracy"] - r["torchscript_accuracy"]) < 1e-9 for r in rows[:2]
    )
    ok = largest >= 0.97 and smallest >= 0.93 and same and result["seconds"] <= args.budget
    say(
        f"targets: largest {100 * largest:.2f}% (>= 97), smallest {100 * smallest:.2f}% (>= 93), "
        f"exported same: {same}, training {result['seconds']:.0f} s (<= {args.budget:.0f}) -> "
        f"{'MET' if ok else 'MISSED'}"
    )
    if args.out:
        args.out.write_text(
            json.dumps(
                {"config": cfg.to_dict(), "seconds": result["seconds"], "rows": rows, "met": ok}, indent=2
            )
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
