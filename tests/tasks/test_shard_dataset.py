"""Reading packed shards back: the same tensors as the file-based tasks, missing shards, threads, and
one training step of a workload on shard tasks."""

from __future__ import annotations

import pickle
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
from PIL import Image

from protocol.shards import ManifestMismatch
from supernet.workload import workload_for
from tasks import get_task
from tasks.shards.dataset import (
    CIFAR10_MEAN,
    CIFAR10_STD,
    ShardDataset,
    ShardDirectory,
    ShardMissing,
    shard_task,
)
from tasks.shards.pack import pack_dataset, shard_path, training_order
from tasks.transforms import pil_image_transform
from tests.tasks.test_shard_packing import make_cifar, make_image_tree, make_train_val

SMALL = dict(width_mult=0.25, head_channels=64, channel_divisor=4, batch_size=4, num_subnets=2)


def locator(directory):
    return ShardDirectory(directory)


def assert_same_samples(ours, theirs, order=None):
    """Sample i of ``ours`` is sample ``order[i]`` of ``theirs`` (training shards are shuffled)."""
    assert len(ours) == len(theirs)
    order = order or list(range(len(ours)))
    for i in range(len(ours)):
        (x, y), (x_ref, y_ref) = ours[i], theirs[order[i]]
        assert y == y_ref and x.dtype == torch.float32 and torch.equal(x, x_ref), i


def test_imagefolder_shards_give_the_imagefolder_tasks_samples(tmp_path):
    data = make_train_val(tmp_path / "d", per_class=(7, 3), size=(16, 16))
    packed = pack_dataset("imagefolder", data, tmp_path / "out", shard_samples=4)
    task = shard_task(packed.spec, packed.manifest, locator(packed.directory))
    reference = get_task("imagefolder", str(data), image_size=16, augment=True)
    assert_same_samples(task.train_set, reference.train_set, training_order(len(task.train_set), 0))
    assert_same_samples(task.val_set, reference.val_set)
    assert task.name == "imagefolder" and task.input_size == (3, 16, 16) and task.num_classes == 3
    assert task.classes == reference.classes and task.augmentation == reference.augmentation
    assert task.manifest == packed.manifest and task.options["root"] == packed.spec.root


def test_the_tree_split_is_the_imagefolder_tasks_split(tmp_path):
    data = make_image_tree(tmp_path / "d", per_class=10, size=(12, 12))
    packed = pack_dataset("imagefolder", data, tmp_path / "out", seed=5, val_fraction=0.2, shard_samples=6)
    task = shard_task(packed.spec, packed.manifest, locator(packed.directory), augment=False)
    reference = get_task(
        "imagefolder", str(data), image_size=12, split_seed=5, val_fraction=0.2, augment=False
    )
    assert task.augmentation is None
    assert_same_samples(task.train_set, reference.train_set, training_order(len(task.train_set), 5))
    assert_same_samples(task.val_set, reference.val_set)


def test_cifar_shards_give_the_raw_rows_as_the_cifar_task_transforms_them(tmp_path):
    train, train_labels, test, test_labels = make_cifar(tmp_path / "c", per_batch=5, test=6)
    packed = pack_dataset("cifar10", tmp_path / "c", tmp_path / "out", shard_samples=4)
    task = shard_task(packed.spec, packed.manifest, locator(packed.directory))
    transform = pil_image_transform(32, CIFAR10_MEAN, CIFAR10_STD)  # what tasks.cifar applies to a row
    shuffled = training_order(len(train), 0)
    for dataset, rows, labels, order in (
        (task.train_set, train, train_labels, shuffled),
        (task.val_set, test, test_labels, list(range(len(test)))),
    ):
        assert len(dataset) == len(rows)
        for i in range(len(rows)):
            x, y = dataset[i]
            row = order[i]
            expected = transform(Image.fromarray(rows[row].reshape(3, 32, 32).transpose(1, 2, 0)))
            assert y == labels[row] and torch.equal(x, expected), i
    assert task.num_classes == 10 and task.input_size == (3, 32, 32) and task.augmentation.crop_padding == 4


def test_a_missing_or_altered_shard_raises_shard_missing(tmp_path):
    data = make_image_tree(tmp_path / "d", per_class=8, size=(8, 8))
    packed = pack_dataset("imagefolder", data, tmp_path / "out", shard_samples=5, val_fraction=0.25)
    train = packed.manifest.split("train")
    held = {train[0].digest}
    dataset = ShardDataset(
        train,
        lambda e: shard_path(packed.directory, e.digest) if e.digest in held else None,
        shard_task(packed.spec, packed.manifest, locator(packed.directory)).train_set.decode,
    )
    assert len(dataset) == packed.spec.train_samples == 18
    assert dataset[4][0].shape == (3, 8, 8)
    with pytest.raises(ShardMissing) as info:
        dataset[5]
    assert f"shard 1 ({train[1].digest})" in str(info.value) and info.value.entry == train[1]
    with pytest.raises(IndexError):
        dataset[18]
    # A file that is gone, or whose bytes differ from the digest, is missing too.
    task = shard_task(packed.spec, packed.manifest, locator(packed.directory))
    path = shard_path(packed.directory, train[2].digest)
    raw = path.read_bytes()
    path.write_bytes(raw[:-1] + bytes([raw[-1] ^ 1]))
    with pytest.raises(ShardMissing, match="shard 2 .*does not match"):
        task.train_set[10]
    path.unlink()
    with pytest.raises(ShardMissing, match="shard 2 .*is not available"):
        task.train_set[11]
    gone = ShardDataset(train, lambda e: shard_path(packed.directory, e.digest), task.train_set.decode)
    with pytest.raises(ShardMissing, match="shard 2 .*is missing: no file"):
        gone[11]
    # Entries of a split must be given whole and in order.
    with pytest.raises(ValueError, match="starts at sample"):
        ShardDataset(train[1:], locator(packed.directory), task.train_set.decode)


def test_a_shard_file_that_does_not_hash_to_its_entry_is_refused(tmp_path):
    data = make_image_tree(tmp_path / "d", per_class=6, size=(8, 8))
    packed = pack_dataset("imagefolder", data, tmp_path / "out", shard_samples=4, val_fraction=0.25)
    train = packed.manifest.split("train")
    path = shard_path(packed.directory, train[0].digest)
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 0xFF  # one byte of the last sample's image
    path.write_bytes(bytes(raw))
    dataset = ShardDataset(train, locator(packed.directory), shard_task(
        packed.spec, packed.manifest, locator(packed.directory)).train_set.decode)  # fmt: skip
    with pytest.raises(ShardMissing, match="does not match the bytes of"):
        dataset[0]
    assert dataset[train[1].first_sample] is not None  # the other shards still read


def test_concurrent_reads_with_a_tiny_cache_give_the_sequential_samples(tmp_path):
    data = make_image_tree(tmp_path / "d", per_class=12, size=(8, 8))
    packed = pack_dataset("imagefolder", data, tmp_path / "out", shard_samples=3, val_fraction=0.25)
    task = shard_task(packed.spec, packed.manifest, locator(packed.directory))
    sequential = [task.train_set[i][0] for i in range(len(task.train_set))]
    dataset = ShardDataset(
        packed.manifest.split("train"), locator(packed.directory), task.train_set.decode, cached_shards=1
    )
    order = np.random.default_rng(0).permutation(len(dataset)).tolist() * 3
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda i: (i, dataset[i][0]), order))
    assert all(torch.equal(x, sequential[i]) for i, x in results)
    assert len(dataset._cache) == 1
    copy = pickle.loads(pickle.dumps(task.val_set))  # DataLoader workers get a copy without the cache
    assert torch.equal(copy[2][0], task.val_set[2][0])


def test_shard_task_refuses_a_manifest_the_spec_did_not_sign_and_unknown_options(tmp_path):
    data = make_image_tree(tmp_path / "d", per_class=6, size=(8, 8))
    packed = pack_dataset("imagefolder", data, tmp_path / "out", shard_samples=4, val_fraction=0.3)
    shorter = packed.manifest.model_copy(update={"shards": packed.manifest.shards[:-1]})
    with pytest.raises(ManifestMismatch):
        shard_task(packed.spec, shorter, locator(packed.directory))
    with pytest.raises(ValueError, match="colour: not an option"):
        shard_task(packed.spec, packed.manifest, locator(packed.directory), colour=True)


@pytest.mark.parametrize("kind", ["imagefolder", "cifar10"])
def test_one_workload_step_on_a_classification_shard_task(tmp_path, kind):
    if kind == "cifar10":
        make_cifar(tmp_path / "d", per_batch=2, test=4)
    else:
        make_image_tree(tmp_path / "d", per_class=6, size=(16, 16))
    packed = pack_dataset(kind, tmp_path / "d", tmp_path / "out", shard_samples=4, val_fraction=0.3)
    task = shard_task(packed.spec, packed.manifest, locator(packed.directory))
    workload = workload_for(kind, SMALL, task=task)
    net = workload.build()
    generator = torch.Generator().manual_seed(0)
    inputs, targets = workload.batch([0, 3, 5, 7], generator)
    assert inputs.shape == (4, *packed.spec.sample_shape) and targets.shape == (4,)
    configs = [net.largest_config(), net.smallest_config()]
    stats = workload.accumulate(net, (inputs, targets), configs, torch.device("cpu"), generator)
    assert stats["samples"] == 4 and np.isfinite(stats["loss"])
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in net.parameters())
