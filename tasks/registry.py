"""The task registry: ``get_task(name, data_dir=None, **opts) -> Task``.

A :class:`Task` bundles what a training run needs from its data: the train and validation datasets
(torch ``Dataset`` objects with deterministic ``torchvision.transforms.v2`` transforms), the random
training augmentation applied to batches (:mod:`tasks.augmentation`), the input size, and the loss
and metric. Built-in tasks register themselves with :func:`register_task`; their modules are
imported on first use, so ``import tasks`` stays cheap.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

if TYPE_CHECKING:  # importing it loads torchvision; ``import tasks`` stays cheap
    from tasks.augmentation import Augmentation

__all__ = [
    "DatasetError",
    "Task",
    "accuracy",
    "available_tasks",
    "classification_loss",
    "get_task",
    "register_task",
]

# The module that defines each built-in task, imported on first use: get_task imports only the one
# it is asked for (each peer agent, worker and aggregator builds one task; the file-based ones import
# torchvision's datasets), available_tasks all of them.
BUILTIN_TASK_MODULES = {
    "digits": "tasks.digits",
    "imagefolder": "tasks.imagefolder",
    "cifar10": "tasks.cifar",
    "stereo-synthetic": "tasks.stereo.task",
    "stereo-folder": "tasks.stereo.folder_task",
}

_REGISTRY: dict[str, Callable[..., Task]] = {}


class DatasetError(ValueError):
    """A dataset directory is missing or malformed; the message is one line saying what was expected."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(str(message).split()))


def accuracy(outputs: torch.Tensor, targets: torch.Tensor) -> float:
    """Top-1 accuracy in [0, 1] of logits or probabilities against integer labels."""
    return (outputs.argmax(dim=1) == targets).float().mean().item()


def classification_loss(label_smoothing: float = 0.0) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """Cross-entropy on logits (optionally label-smoothed)."""

    def loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits, targets, label_smoothing=label_smoothing)

    return loss


@dataclass
class Task:
    """Everything a training run takes from a task.

    ``loss(logits, targets)`` is the training loss; ``metric(outputs, targets)`` the validation
    metric of one batch (a mean over samples, so a weighted mean over batches is the dataset value),
    higher is better when ``higher_is_better``. ``input_size`` is (channels, height, width).
    Both datasets give deterministic samples; ``augmentation(inputs, generator)`` (if any) is the
    random augmentation of a batch of training inputs, drawn from the generator of the computation
    that forms the batch, never from torch's global one (see :mod:`tasks.augmentation`).
    """

    name: str
    num_classes: int | None
    input_size: tuple[int, int, int]
    train_set: Dataset
    val_set: Dataset
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    metric: Callable[[torch.Tensor, torch.Tensor], float] = accuracy
    metric_name: str = "accuracy"
    higher_is_better: bool = True
    classes: tuple[str, ...] = ()
    options: dict[str, Any] = field(default_factory=dict)
    augmentation: Augmentation | None = None
    # tasks on an operator's dataset: the shard list (protocol.shards.DataManifest) the sets read from
    manifest: Any = None

    def __repr__(self) -> str:
        return (
            f"Task({self.name!r}, classes={self.num_classes}, input={self.input_size}, "
            f"train={len(self.train_set)}, val={len(self.val_set)})"
        )


def register_task(name: str) -> Callable[[Callable[..., Task]], Callable[..., Task]]:
    """Decorator: register ``factory(data_dir=None, **opts) -> Task`` under ``name``."""

    def decorate(factory: Callable[..., Task]) -> Callable[..., Task]:
        if name in _REGISTRY and _REGISTRY[name] is not factory:
            raise ValueError(f"task: {name!r} is already registered")
        _REGISTRY[name] = factory
        return factory

    return decorate


def _load_builtins(name: str | None = None) -> None:
    """Import the module of built-in task ``name``, or of every built-in task if it is not one."""
    modules = [BUILTIN_TASK_MODULES[name]] if name in BUILTIN_TASK_MODULES else BUILTIN_TASK_MODULES.values()
    for module in modules:
        importlib.import_module(module)


def available_tasks() -> list[str]:
    _load_builtins()
    return sorted(_REGISTRY)


def get_task(name: str, data_dir: str | None = None, **opts: Any) -> Task:
    """Build the task ``name``; ``data_dir`` is where its files are (unused by ``digits``).

    Unknown names or options raise ``ValueError``; a missing or malformed dataset directory raises
    :class:`DatasetError` (a ``ValueError``) with a one-line message.
    """
    _load_builtins(name)
    factory = _REGISTRY.get(name)
    if factory is None:
        raise ValueError(f"task: unknown {name!r} (available: {', '.join(sorted(_REGISTRY))})")
    params = inspect.signature(factory).parameters
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        for key in opts:
            if key not in params or key == "data_dir":
                allowed = ", ".join(k for k in params if k != "data_dir")
                raise ValueError(f"{key}: not an option of task {name!r} (options: {allowed})")
    return factory(data_dir=data_dir, **opts)
