"""Built-in training tasks: datasets, transforms, losses and metrics.

from tasks import get_task
task = get_task("digits")            # also "imagefolder" and "cifar10" (need data_dir)
"""

from tasks.registry import (
    DatasetError,
    Task,
    accuracy,
    available_tasks,
    classification_loss,
    get_task,
    register_task,
)
from tasks.sharding import shard_indices

__all__ = [
    "DatasetError",
    "Task",
    "accuracy",
    "available_tasks",
    "classification_loss",
    "get_task",
    "register_task",
    "shard_indices",
]
