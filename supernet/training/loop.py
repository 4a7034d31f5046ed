"""The single-process training loop, :func:`train`: every piece of one step, in order."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import torch

from supernet.config import derive_seed
from supernet.training.batches import training_batch
from supernet.training.build import build_supernet
from supernet.training.config import TrainConfig
from supernet.training.evaluation import evaluate_subnets
from supernet.training.gradients import accumulate_gradients
from supernet.training.optimizer import make_optimizer, optimizer_step
from supernet.training.schedule import maybe_sort_channels, phase_at, step_configs
from tasks import Task, get_task
from tasks.sharding import shard_indices

__all__ = ["train"]

log = logging.getLogger(__name__)


def _format_rows(rows: list[dict[str, Any]], metric: str) -> str:
    return ", ".join(f"{r['name']} {100 * r[metric]:.2f}%" for r in rows)


def train(
    cfg: TrainConfig,
    task: Task | None = None,
    *,
    progress: Callable[[str], None] | None = None,
    participant: str = "local/0",
) -> dict[str, Any]:
    """Train a supernet on one process with exactly the swarm's pieces; returns the results.

    ``task`` defaults to ``tasks.get_task(cfg.task, **cfg.task_options)``. ``progress`` receives one
    line every ``cfg.log_every`` steps and after each evaluation (default: this module's logger).
    The result: ``net`` (the trained supernet), ``history`` (per-step loss, lr, seconds), ``evaluations``
    (``(step, rows)`` during training), ``final`` (rows of
    :func:`~supernet.training.evaluation.evaluate_subnets`), ``seconds`` (training time, without the
    final evaluation), ``train_macs``.
    """

    say = progress or log.info
    if task is None:
        task = get_task(cfg.task, **cfg.task_options)
    # One generator for the run's augmentation and dropout draws, in step order.
    generator = torch.Generator().manual_seed(derive_seed("data", cfg.seed) % (2**63))
    net = build_supernet(cfg, task.num_classes, task.input_size[0])
    optimizer = make_optimizer(net, cfg)
    history, evaluations, total_macs = [], [], 0
    started = time.perf_counter()
    for step in range(cfg.total_steps):
        if maybe_sort_channels(net, step, cfg, optimizer):
            say(f"step {step}: sorted channels by importance ({phase_at(step, cfg).name} phase)")
        indices = shard_indices(
            len(task.train_set), cfg.seed, step, [participant], participant, cfg.batch_size
        )
        inputs, targets = training_batch(task, indices, generator)
        configs = step_configs(net, step, cfg)
        stats = accumulate_gradients(net, inputs, targets, configs, cfg, task.loss, generator=generator)
        lr = optimizer_step(net, optimizer, step, cfg)
        total_macs += stats["train_macs"]
        elapsed = time.perf_counter() - started
        history.append({"step": step, "loss": stats["loss"], "lr": lr, "seconds": elapsed})
        if cfg.log_every and (step + 1) % cfg.log_every == 0:
            phase = phase_at(step, cfg)
            say(
                f"step {step + 1}/{cfg.total_steps} [{phase.name}{phase.stage or ''}] "
                f"loss {stats['loss']:.4f} lr {lr:.4f} {elapsed:.0f}s"
            )
        if cfg.eval_every and (step + 1) % cfg.eval_every == 0 and step + 1 < cfg.total_steps:
            rows = evaluate_subnets(net, task, cfg)
            evaluations.append((step + 1, rows))
            say(f"step {step + 1}: {_format_rows(rows, task.metric_name)}")
    seconds = time.perf_counter() - started
    final = evaluate_subnets(net, task, cfg)
    say(f"final after {seconds:.0f}s: {_format_rows(final, task.metric_name)}")
    return {
        "net": net,
        "task": task,
        "history": history,
        "evaluations": evaluations,
        "final": final,
        "seconds": seconds,
        "train_macs": total_macs,
    }
