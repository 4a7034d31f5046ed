"""Evaluation of sub-networks: BN recalibration on training batches, then the task metric."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from supernet.bn import recalibrate_bn
from supernet.classification import ClassificationSupernet
from supernet.config import SubnetConfig, derive_seed
from supernet.training.config import TrainConfig

if TYPE_CHECKING:
    from tasks.registry import Task

__all__ = [
    "calibration_loader",
    "recalibrate_for_evaluation",
    "evaluate",
    "evaluation_configs",
    "evaluate_subnets",
]


def calibration_loader(dataset: Dataset, cfg: TrainConfig, seed: int = 0) -> DataLoader:
    """Shuffled training batches for BN recalibration, in a fixed order (seeded generator)."""
    generator = torch.Generator().manual_seed(derive_seed("bn-calibration", cfg.seed, seed) % (2**63))
    return DataLoader(dataset, batch_size=cfg.batch_size, shuffle=True, drop_last=True, generator=generator)


def recalibrate_for_evaluation(
    net: ClassificationSupernet, sub: SubnetConfig, task: Task, cfg: TrainConfig
) -> None:
    """BN recalibration of ``sub`` on ``cfg.bn_calibration_batches`` training batches, reproducibly.

    The batches' order and their augmentation are drawn from generators seeded by ``cfg.seed``, the
    same for every sub-network, so evaluating the same parameters twice gives the same statistics in
    any thread; torch's global generator is not used.
    """
    generator = torch.Generator().manual_seed(derive_seed("bn-augmentation", cfg.seed) % (2**63))
    batches = calibration_loader(task.train_set, cfg)
    if task.augmentation is not None:
        batches = ((task.augmentation(x, generator), y) for x, y in batches)
    recalibrate_bn(net, sub, batches, cfg.bn_calibration_batches)


@torch.no_grad()
def evaluate(
    model: nn.Module, dataset: Dataset, metric: Callable, batch_size: int = 256, device: str = "cpu"
) -> float:
    """The dataset-level metric of ``model`` (eval mode): a sample-weighted mean of per-batch metrics."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    # An own generator: a DataLoader draws a (here unused) worker seed, from the global one otherwise.
    for inputs, targets in DataLoader(dataset, batch_size=batch_size, generator=torch.Generator()):
        outputs = model(inputs.to(device))
        total += metric(outputs, targets.to(device)) * len(targets)
        count += len(targets)
    model.train(was_training)
    return total / max(count, 1)


def evaluation_configs(
    net: ClassificationSupernet, cfg: TrainConfig, num_random: int | None = None
) -> dict[str, SubnetConfig]:
    """The sub-networks evaluated: ``largest``, ``smallest`` and ``random-i`` (fixed by the seed)."""
    num_random = cfg.eval_random_subnets if num_random is None else num_random
    out = {"largest": net.largest_config(), "smallest": net.smallest_config()}
    for i in range(num_random):
        out[f"random-{i + 1}"] = net.sample_config(derive_seed("eval", cfg.seed, i))
    return out


def evaluate_subnets(
    net: ClassificationSupernet,
    task: Task,
    cfg: TrainConfig,
    configs: dict[str, SubnetConfig] | None = None,
    *,
    export: bool = False,
) -> list[dict[str, Any]]:
    """Evaluate sub-networks after BN recalibration (default: largest, smallest, a few random).

    Each row: ``name``, ``config`` (str), ``hash``, ``macs``, ``params``, the task metric (key
    ``task.metric_name``) and, with ``export=True``, ``exported_<metric>`` measured on the
    standalone model exported after recalibration.
    """
    configs = evaluation_configs(net, cfg) if configs is None else configs
    input_size = task.input_size
    rows = []
    for name, sub in configs.items():
        recalibrate_for_evaluation(net, sub, task, cfg)
        row = {
            "name": name,
            "config": str(sub),
            "hash": sub.hash,
            "macs": net.flops(sub, input_size),
            "params": net.num_parameters(sub),
            task.metric_name: evaluate(net, task.val_set, task.metric, cfg.eval_batch_size, cfg.device),
        }
        if export:
            model = net.export(sub)
            row[f"exported_{task.metric_name}"] = evaluate(
                model, task.val_set, task.metric, cfg.eval_batch_size, cfg.device
            )
        rows.append(row)
    return rows
