"""``cifar10``: torchvision's ``CIFAR10`` reading the standard python batches, never downloading.

``data_dir`` must hold the extracted ``cifar-10-python.tar.gz``::

    <dir>/cifar-10-batches-py/data_batch_1 ... data_batch_5, test_batch, batches.meta

(``data_dir`` may also point at ``cifar-10-batches-py`` itself). torchvision checks every file's MD5,
so only the genuine files are accepted; anything missing or altered gives a one-line
:class:`~tasks.registry.DatasetError` naming this layout. Train: 50,000 images (random crop with 4
pixels of padding, horizontal flip); validation: the 10,000 test images.
"""

from __future__ import annotations

from pathlib import Path

from torchvision.datasets import CIFAR10

from tasks.registry import DatasetError, Task, classification_loss, register_task
from tasks.transforms import crop_and_flip, pil_image_transform

__all__ = ["cifar10_task", "CIFAR10_FILES", "CIFAR10_FOLDER"]

CIFAR10_FOLDER = "cifar-10-batches-py"
CIFAR10_FILES = tuple(f"data_batch_{i}" for i in range(1, 6)) + ("test_batch", "batches.meta")
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)


def layout(root: Path | str) -> str:
    return (
        f"{root}/{CIFAR10_FOLDER}/data_batch_1..data_batch_5, test_batch, batches.meta "
        "(the extracted cifar-10-python.tar.gz)"
    )


@register_task("cifar10")
def cifar10_task(data_dir: str | None = None, augment: bool = True, label_smoothing: float = 0.0) -> Task:
    if data_dir is None:
        raise DatasetError(f"cifar10: needs a data directory; expected {layout('<dir>')}")
    root = Path(data_dir).expanduser()
    if root.name == CIFAR10_FOLDER:
        root = root.parent
    missing = [name for name in CIFAR10_FILES if not (root / CIFAR10_FOLDER / name).is_file()]
    if missing:
        raise DatasetError(f"cifar10: missing {', '.join(missing)}; expected {layout(root)}")
    transform = pil_image_transform(32, CIFAR10_MEAN, CIFAR10_STD)
    try:
        train_set = CIFAR10(str(root), train=True, download=False, transform=transform)
        val_set = CIFAR10(str(root), train=False, download=False, transform=transform)
    except (RuntimeError, OSError, ValueError, EOFError) as exc:
        reason = str(exc).split("\n")[0] or type(exc).__name__
        raise DatasetError(
            f"cifar10: the files under {root / CIFAR10_FOLDER} are not the genuine CIFAR-10 batches ({reason}); "
            f"expected {layout(root)}"
        ) from None
    return Task(
        name="cifar10",
        num_classes=10,
        input_size=(3, 32, 32),
        train_set=train_set,
        val_set=val_set,
        loss=classification_loss(label_smoothing),
        augmentation=crop_and_flip(32, hflip=True, crop_padding=4) if augment else None,
        classes=tuple(train_set.classes),
        options={"data_dir": str(root), "augment": augment},
    )
