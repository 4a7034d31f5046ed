"""Built-in classification tasks: registry, digits, imagefolder and cifar10 (layouts and errors)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from tasks import DatasetError, Task, available_tasks, get_task
from tasks.digits import load_digit_arrays, stratified_split
from tests.helpers import modules_loaded_by


def test_registry_lists_builtins_and_rejects_unknowns():
    assert {"digits", "imagefolder", "cifar10"} <= set(available_tasks())
    with pytest.raises(ValueError, match="unknown 'mnist'.*digits"):
        get_task("mnist")
    with pytest.raises(ValueError, match="^colour: not an option of task 'digits'"):
        get_task("digits", colour="red")


def test_digits_is_real_32x32_data_with_a_fixed_split():
    task = get_task("digits")
    assert isinstance(task, Task)
    assert task.name == "digits" and task.num_classes == 10 and task.input_size == (1, 32, 32)
    assert len(task.train_set) + len(task.val_set) == 1797
    assert len(task.val_set) == pytest.approx(0.2 * 1797, abs=10)
    x, y = task.val_set[0]
    assert x.shape == (1, 32, 32) and x.dtype == torch.float32 and 0 <= y < 10
    # validation items are deterministic, training items are augmented (batch-wise, from a generator)
    assert torch.equal(task.val_set[3][0], task.val_set[3][0])
    item = task.train_set[3][0][None]
    assert torch.equal(item, task.train_set[3][0][None])  # the dataset itself draws nothing
    generator = torch.Generator().manual_seed(0)
    assert not torch.equal(task.augmentation(item, generator), task.augmentation(item, generator))
    again = get_task("digits", augment=False)
    assert torch.equal(again.val_set.images, task.val_set.images)
    assert torch.equal(again.train_set[5][0], again.train_set[5][0]) and again.augmentation is None
    labels = task.val_set.labels.numpy()
    assert set(np.bincount(labels, minlength=10)) <= set(range(33, 40))  # stratified
    logits = torch.zeros(4, 10)
    logits[torch.arange(4), torch.tensor([1, 2, 3, 4])] = 1.0
    assert task.metric(logits, torch.tensor([1, 2, 0, 0])) == 0.5
    assert task.loss(logits, torch.tensor([1, 2, 3, 4])).item() > 0
    assert get_task("digits", image_size=16).train_set[0][0].shape == (1, 16, 16)


def test_digits_are_sklearns_digits_resized_and_normalised_as_torchvision_does():
    # The task is built without either library (a process that only builds it must not pay for
    # importing them); what it gives must be what they give, bit for bit.
    from sklearn.datasets import load_digits
    from torchvision.transforms import v2

    reference = load_digits()
    pixels, target = load_digit_arrays()
    assert np.array_equal(pixels, reference.images) and np.array_equal(target, reference.target)
    task = get_task("digits", augment=False)
    images = torch.from_numpy(np.asarray(reference.images, dtype=np.float32) / 16.0).unsqueeze(1)
    images = v2.functional.resize(images, [32, 32], antialias=True).clamp_(0.0, 1.0)
    _, val_idx = stratified_split(np.asarray(reference.target, dtype=np.int64), 0.2, 0)
    normalize = v2.Normalize(task.val_set.transform.mean, task.val_set.transform.std)
    for k in (0, 7, len(val_idx) - 1):
        assert torch.equal(task.val_set[k][0], normalize(images[val_idx[k]]))


def test_building_the_digits_task_imports_neither_torchvision_nor_sklearn():
    # Every peer agent, worker and aggregator builds the task at start; a worker also augments.
    code = (
        "import torch; from supernet.workload import workload_for; w = workload_for('digits'); w.build(); "
        "w.task.augmentation(torch.zeros(4, 1, 32, 32), torch.Generator())"
    )
    assert modules_loaded_by(code, ("torchvision", "sklearn", "tasks.cifar")) == []


def test_stratified_split_is_disjoint_and_deterministic():
    labels = np.repeat(np.arange(4), 10)
    train, val = stratified_split(labels, 0.3, seed=1)
    assert len(np.intersect1d(train, val)) == 0 and len(train) + len(val) == 40
    assert np.array_equal(val, stratified_split(labels, 0.3, seed=1)[1])
    assert not np.array_equal(val, stratified_split(labels, 0.3, seed=2)[1])
    assert all((labels[val] == c).sum() == 3 for c in range(4))
    with pytest.raises(ValueError, match="^val_fraction"):
        stratified_split(labels, 1.5, 0)


def _write_pngs(root: Path, classes=("cat", "dog", "eel"), per_class=6, size=(20, 14)) -> None:
    rng = np.random.default_rng(0)
    for c in classes:
        (root / c).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            pixels = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / c / f"{i}.png")


def test_imagefolder_single_tree_split(tmp_path):
    _write_pngs(tmp_path)
    task = get_task("imagefolder", data_dir=str(tmp_path), image_size=24, val_fraction=0.5)
    assert task.num_classes == 3 and task.classes == ("cat", "dog", "eel") and task.input_size == (3, 24, 24)
    assert len(task.train_set) == 9 and len(task.val_set) == 9
    assert set(task.train_set.indices).isdisjoint(task.val_set.indices)
    x, y = task.val_set[0]
    assert x.shape == (3, 24, 24) and x.dtype == torch.float32 and y in (0, 1, 2)
    grey = get_task("imagefolder", data_dir=str(tmp_path), grayscale=True)
    assert grey.input_size == (1, 32, 32) and grey.train_set[0][0].shape == (1, 32, 32)


def test_imagefolder_train_val_layout(tmp_path):
    _write_pngs(tmp_path / "train", per_class=4)
    _write_pngs(tmp_path / "val", per_class=2)
    task = get_task("imagefolder", data_dir=str(tmp_path))
    assert len(task.train_set) == 12 and len(task.val_set) == 6 and task.num_classes == 3


def _one_line_error(**kw) -> str:
    with pytest.raises(DatasetError) as err:
        get_task(**kw)
    message = str(err.value)
    assert "\n" not in message and message
    assert isinstance(err.value, ValueError)
    return message


def test_imagefolder_errors_are_one_line(tmp_path):
    assert "does not exist" in _one_line_error(name="imagefolder", data_dir=str(tmp_path / "nope"))
    assert "needs a data directory" in _one_line_error(name="imagefolder")
    (tmp_path / "file.png").write_bytes(b"x")
    assert "not a directory" in _one_line_error(name="imagefolder", data_dir=str(tmp_path / "file.png"))
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "no class folders" in _one_line_error(name="imagefolder", data_dir=str(empty))
    no_images = tmp_path / "noimages"
    (no_images / "a").mkdir(parents=True)
    (no_images / "a" / "notes.txt").write_text("hi")
    assert "has no image files" in _one_line_error(name="imagefolder", data_dir=str(no_images))
    half = tmp_path / "half"
    _write_pngs(half / "train", per_class=2)
    assert "val" in _one_line_error(name="imagefolder", data_dir=str(half))
    mismatch = tmp_path / "mismatch"
    _write_pngs(mismatch / "train", per_class=2)
    _write_pngs(mismatch / "val", classes=("cat", "dog"), per_class=2)
    assert "class folders differ" in _one_line_error(name="imagefolder", data_dir=str(mismatch))


LAYOUT = "cifar-10-batches-py/data_batch_1..data_batch_5, test_batch, batches.meta"


def test_cifar10_missing_files_name_the_expected_layout(tmp_path):
    message = _one_line_error(name="cifar10", data_dir=str(tmp_path))
    assert f"{tmp_path}/{LAYOUT}" in message and "missing data_batch_1" in message
    assert LAYOUT in _one_line_error(name="cifar10")
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    for name in ("data_batch_1", "data_batch_2", "batches.meta"):
        (folder / name).write_bytes(b"not a pickle")
    message = _one_line_error(name="cifar10", data_dir=str(folder))  # the folder itself works too
    assert "missing data_batch_3, data_batch_4, data_batch_5, test_batch;" in message and LAYOUT in message


def test_cifar10_altered_files_fail_the_integrity_check_in_one_line(tmp_path):
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch", "batches.meta"]:
        (folder / name).write_bytes(b"fake")
    message = _one_line_error(name="cifar10", data_dir=str(tmp_path))
    assert "not the genuine CIFAR-10 batches" in message and LAYOUT in message
