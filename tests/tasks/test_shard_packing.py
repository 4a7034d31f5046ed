"""Packing data sets into content-addressed shards: the container, determinism, the signed root, the
splits, and every malformed input refused with one line and nothing half-published.

Data sets are written here in their real on-disk formats (PNG / JPEG class folders, CIFAR-10 python
pickles with the original dict keys); nothing is downloaded.
"""

from __future__ import annotations

import pickle
import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from protocol.shards import ManifestMismatch, ShardEntry, check_manifest, manifest_root
from tasks.registry import DatasetError
from tasks.shards.container import ShardSample, read_shard, shard_digest, write_shard
from tasks.shards.pack import pack_dataset, shard_path

# ------------------------------------------------------------------------------------------ builders


def make_image_tree(
    root: Path, classes=("cat", "dog", "eel"), per_class=12, size=(16, 12), seed=0, jpeg_every=3
):
    """``root/<class>/<i>.png`` (every ``jpeg_every``-th one a JPEG), RGB noise of ``size`` (w, h)."""
    rng = np.random.default_rng(seed)
    for name in classes:
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            pixels = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
            if jpeg_every and i % jpeg_every == jpeg_every - 1:
                Image.fromarray(pixels).save(root / name / f"{i:03d}.jpg", format="JPEG", quality=90)
            else:
                Image.fromarray(pixels).save(root / name / f"{i:03d}.png", format="PNG")
    return root


def make_train_val(root: Path, per_class=(10, 4), **kwargs) -> Path:
    make_image_tree(root / "train", per_class=per_class[0], seed=1, **kwargs)
    make_image_tree(root / "val", per_class=per_class[1], seed=2, **kwargs)
    return root


CIFAR_NAMES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


def make_cifar(
    root: Path, per_batch=6, test=8, seed=0
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``root/cifar-10-batches-py/`` with the real pickle layout; returns (train, train labels, test, test labels)."""
    rng = np.random.default_rng(seed)
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    datas, labels = [], []

    def batch(name: str, count: int) -> tuple[np.ndarray, list[int]]:
        data = rng.integers(0, 256, (count, 3072), dtype=np.uint8)
        label = [int(v) for v in rng.integers(0, 10, count)]
        entry = {
            b"batch_label": name.encode(),
            b"labels": label,
            b"data": data,
            b"filenames": [f"{name}_{i}.png".encode() for i in range(count)],
        }
        (folder / name).write_bytes(pickle.dumps(entry, protocol=2))
        return data, label

    for i in range(1, 6):
        data, label = batch(f"data_batch_{i}", per_batch)
        datas.append(data)
        labels += label
    test_data, test_labels = batch("test_batch", test)
    meta = {"num_cases_per_batch": per_batch, "label_names": CIFAR_NAMES, "num_vis": 3072}
    (folder / "batches.meta").write_bytes(pickle.dumps(meta, protocol=2))
    return np.concatenate(datas), np.asarray(labels), test_data, np.asarray(test_labels)


def listing(directory: Path) -> dict[str, bytes]:
    """Every file under ``directory`` (relative path → bytes): to see that nothing changed."""
    if not directory.exists():
        return {"<absent>": b""}
    return {
        str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()
    } | {str(p.relative_to(directory)) + "/": b"" for p in directory.rglob("*") if p.is_dir()}


def assert_refused(kind: str, path: Path, out_dir: Path, match: str, **kwargs) -> str:
    """Packing fails with a one-line DatasetError matching ``match``; ``out_dir`` is as it was."""
    before = listing(out_dir)
    with pytest.raises(DatasetError) as info:
        pack_dataset(kind, path, out_dir, **kwargs)
    message = str(info.value)
    assert "\n" not in message and message.strip() == message
    assert match in message, message
    assert listing(out_dir) == before
    return message


# ------------------------------------------------------------------------------------------ container


def test_container_round_trips_and_is_deterministic():
    samples = [ShardSample(3, (b"left", b"", b"\x00\xff")), ShardSample(0, (b"a", b"bc", b"def"))]
    data = write_shard("stereo/kitti2015", samples)
    assert data == write_shard("stereo/kitti2015", list(samples)) and data.startswith(b"MANTASHD")
    reader = read_shard(data)
    assert reader.format == "stereo/kitti2015" and len(reader) == 2
    assert [reader.sample(i) for i in range(2)] == samples
    with pytest.raises(IndexError):
        reader.sample(2)
    assert shard_digest(data) != shard_digest(write_shard("stereo/kitti2015", samples[::-1]))
    with pytest.raises(ValueError, match="blobs"):
        write_shard("x/y", [ShardSample(0, (b"a",)), ShardSample(0, (b"a", b"b"))])


@pytest.mark.parametrize(
    "damage, reason",
    [
        (lambda d: d[:-1], "add up"),
        (lambda d: d + b"x", "add up"),
        (lambda d: b"NOTSHARD" + d[8:], "magic"),
        (lambda d: d[:8] + b"\x02" + d[9:], "version"),
        (lambda d: d[:16] + d[16:].replace(b'"count":1', b'"count":2', 1), "labels"),
        (lambda d: d[:10], "shorter"),
    ],
)
def test_malformed_shards_are_refused_in_one_line(damage, reason):
    data = write_shard("image/png", [ShardSample(1, (b"png-bytes",))])
    with pytest.raises(ValueError, match=reason) as info:
        read_shard(damage(data))
    assert "\n" not in str(info.value)


# ------------------------------------------------------------------------------------------- packing


def test_repacking_gives_the_same_root_and_byte_identical_shards(tmp_path):
    data = make_image_tree(tmp_path / "data", per_class=14)
    first = pack_dataset("imagefolder", data, tmp_path / "a", shard_samples=5, seed=3, val_fraction=0.25)
    second = pack_dataset("imagefolder", data, tmp_path / "b", shard_samples=5, seed=3, val_fraction=0.25)
    assert first.spec == second.spec and first.manifest == second.manifest
    assert listing(tmp_path / "a") == listing(tmp_path / "b")
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == sorted(
        f"{e.digest}.shard" for e in first.manifest.shards
    )
    for entry in first.manifest.shards:
        raw = shard_path(first.directory, entry.digest).read_bytes()
        assert shard_digest(raw) == entry.digest and len(raw) == entry.size
    assert first.spec.bytes == sum(e.size for e in first.manifest.shards)
    # Packing into the same place again keeps the files; another seed is another split, another root.
    again = pack_dataset("imagefolder", data, tmp_path / "a", shard_samples=5, seed=3, val_fraction=0.25)
    assert again.spec.root == first.spec.root and listing(tmp_path / "a") == listing(tmp_path / "b")
    other = pack_dataset("imagefolder", data, tmp_path / "c", shard_samples=5, seed=4, val_fraction=0.25)
    assert other.spec.root != first.spec.root


def test_manifest_matches_the_spec_and_any_changed_byte_fails(tmp_path):
    packed = pack_dataset("imagefolder", make_image_tree(tmp_path / "d"), tmp_path / "out", shard_samples=4)
    spec, manifest = packed.spec, packed.manifest
    check_manifest(manifest, spec)
    assert manifest_root(manifest.shards) == spec.root and spec.shards == len(manifest.shards)
    entry = manifest.shards[2]
    changes = [
        {"digest": ("0" if entry.digest[0] != "0" else "1") + entry.digest[1:]},
        {"size": entry.size + 1},
        {"decoded_bytes": entry.decoded_bytes - 1},
        {"format": "image/jpeg" if entry.format != "image/jpeg" else "image/png"},
    ]
    for change in changes:
        altered = list(manifest.shards)
        altered[2] = ShardEntry.model_validate({**entry.model_dump(), **change})
        with pytest.raises(ManifestMismatch, match="root"):
            check_manifest(manifest.model_copy(update={"shards": tuple(altered)}), spec)


def test_shards_cut_each_split_in_order(tmp_path):
    data = make_train_val(tmp_path / "d", per_class=(9, 3))  # 27 train, 9 val
    seen = []
    packed = pack_dataset(
        "imagefolder", data, tmp_path / "out", shard_samples=10, progress=lambda d, t: seen.append((d, t))
    )
    spec, shards = packed.spec, packed.manifest.shards
    assert spec.layout == "train-val" and (spec.train_samples, spec.val_samples) == (27, 9)
    assert [(e.index, e.split, e.first_sample, e.samples) for e in shards] == [
        (0, "train", 0, 10),
        (1, "train", 10, 10),
        (2, "train", 20, 7),
        (3, "val", 0, 9),
    ]
    assert spec.sample_shape == (3, 12, 16) and spec.classes == ("cat", "dog", "eel")
    assert all(e.decoded_shape == (3, 12, 16) and e.decoded_bytes == e.samples * 3 * 12 * 16 for e in shards)
    assert {e.format for e in shards} == {"image/mixed"}  # PNGs and JPEGs together
    assert seen[0] == (0, 36) and seen[-1] == (36, 36) and len(seen) == 37
    reader = read_shard(shard_path(packed.directory, shards[3].digest).read_bytes())
    first_val = sorted((data / "val" / "cat").iterdir())[0]
    assert reader.sample(0) == ShardSample(0, (first_val.read_bytes(),))  # original file bytes
    assert [reader.sample(i).label for i in range(9)] == [0, 0, 0, 1, 1, 1, 2, 2, 2]


def test_single_format_shards_are_named_by_it_and_grayscale_becomes_rgb(tmp_path):
    root = tmp_path / "gray"
    for name in ("a", "b"):
        (root / name).mkdir(parents=True)
        for i in range(5):
            Image.fromarray(np.full((8, 10), 40 * i, np.uint8), mode="L").save(root / name / f"{i}.png")
    packed = pack_dataset("imagefolder", root, tmp_path / "out", val_fraction=0.2, shard_samples=100)
    assert packed.spec.sample_shape == (3, 8, 10) and {e.format for e in packed.manifest.shards} == {
        "image/png"
    }


def test_the_tree_split_is_stratified_seeded_and_deterministic(tmp_path):
    data = make_image_tree(tmp_path / "d", per_class=20)
    packs = [
        pack_dataset("imagefolder", data, tmp_path / f"o{i}", seed=s, val_fraction=0.25)
        for i, s in enumerate((0, 0, 1))
    ]
    assert all(p.spec.layout == "tree" for p in packs)
    assert (packs[0].spec.train_samples, packs[0].spec.val_samples) == (45, 15)
    assert packs[0].spec.root == packs[1].spec.root != packs[2].spec.root
    with pytest.raises(ValueError, match="val_fraction"):
        pack_dataset("imagefolder", data, tmp_path / "x", val_fraction=1.0)


def test_cifar10_is_read_from_its_pickles(tmp_path):
    train, train_labels, test, test_labels = make_cifar(tmp_path / "c", per_batch=6, test=8)
    packed = pack_dataset("cifar10", tmp_path / "c", tmp_path / "out", shard_samples=7)
    spec = packed.spec
    assert (spec.kind, spec.layout, spec.train_samples, spec.val_samples) == ("cifar10", "python", 30, 8)
    assert spec.classes == tuple(CIFAR_NAMES) and spec.sample_shape == (3, 32, 32)
    assert {e.format for e in packed.manifest.shards} == {"cifar/chw-u8"}
    val = packed.manifest.split("val")[0]
    reader = read_shard(shard_path(packed.directory, val.digest).read_bytes())
    assert reader.sample(5) == ShardSample(int(test_labels[5]), (test[5].tobytes(),))
    # The folder itself is accepted too, and gives the same shards.
    same = pack_dataset("cifar10", tmp_path / "c" / "cifar-10-batches-py", tmp_path / "out2", shard_samples=7)
    assert same.spec.root == spec.root


# --------------------------------------------------------------------------------------- bad inputs


@pytest.fixture
def out_dir(tmp_path) -> Path:
    """An output folder already holding a shard of an earlier pack: it must survive failures unchanged."""
    out = tmp_path / "out"
    out.mkdir()
    (out / ("ab" * 32 + ".shard")).write_bytes(b"an earlier shard")
    return out


def test_an_unreadable_image_is_named_even_after_shards_were_written(tmp_path, out_dir):
    data = make_image_tree(tmp_path / "d", per_class=12)
    broken = data / "eel" / "011.png"  # the last file listed: earlier shards are written by then
    broken.write_bytes(b"\x89PNG\r\n\x1a\n not really")
    assert_refused("imagefolder", data, out_dir, f"{broken}", shard_samples=3, val_fraction=0.25)
    assert_refused("imagefolder", data, tmp_path / "fresh", f"cannot read {broken}", shard_samples=3)
    assert not (tmp_path / "fresh").exists()


def test_mixed_image_sizes_name_both_files_and_sizes(tmp_path, out_dir):
    data = make_image_tree(tmp_path / "d", per_class=4, size=(32, 32), jpeg_every=0)
    Image.new("RGB", (40, 32)).save(data / "dog" / "001.png")
    message = assert_refused("imagefolder", data, out_dir, "all images must have one size", val_fraction=0.25)
    # the other file is the first one packed (the training samples are packed shuffled)
    assert re.search(
        rf"{re.escape(str(data / 'dog' / '001.png'))} is 40x32 but {re.escape(str(data))}/\w+/\d+\.png is 32x32",
        message,
    )


@pytest.mark.parametrize(
    "build, match",
    [
        (lambda d: d.mkdir(), "no class folders in"),
        (lambda d: (d / "cat").mkdir(parents=True), "has no image files"),
        (lambda d: make_image_tree(d / "train", per_class=3), "val is not a folder"),
        (lambda d: None, "does not exist"),
        (lambda d: make_image_tree(d, per_class=1), "both splits need images"),
    ],
)
def test_wrong_image_folder_layouts_say_what_was_expected(tmp_path, out_dir, build, match):
    data = tmp_path / "d"
    build(data)
    assert_refused("imagefolder", data, out_dir, match)


def test_train_and_val_class_folders_must_match(tmp_path, out_dir):
    data = make_train_val(tmp_path / "d")
    (data / "val" / "fox").mkdir()
    Image.new("RGB", (16, 12)).save(data / "val" / "fox" / "0.png")
    assert_refused("imagefolder", data, out_dir, "class folders differ")


def test_cifar_batches_missing_or_unreadable_are_named(tmp_path, out_dir):
    make_cifar(tmp_path / "c")
    folder = tmp_path / "c" / "cifar-10-batches-py"
    (folder / "data_batch_3").unlink()
    assert_refused("cifar10", tmp_path / "c", out_dir, "missing data_batch_3")
    (folder / "data_batch_3").write_bytes(b"not a pickle")
    assert_refused("cifar10", tmp_path / "c", out_dir, f"cannot read {folder / 'data_batch_3'}")
    (folder / "data_batch_3").write_bytes(
        pickle.dumps({b"data": np.zeros((2, 100), np.uint8), b"labels": [0, 1]})
    )
    assert_refused(
        "cifar10", tmp_path / "c", out_dir, f"{folder / 'data_batch_3'}: 'data' must be a uint8 N x 3072"
    )

    class Evil:
        def __reduce__(self):
            return (print, ("executed",))

    (folder / "data_batch_3").write_bytes(pickle.dumps({b"data": Evil()}))
    assert_refused("cifar10", tmp_path / "c", out_dir, "refusing to load builtins.print")
    assert_refused("cifar10", tmp_path / "nowhere", out_dir, "is not a folder")


def test_bad_arguments_are_value_errors(tmp_path):
    data = make_image_tree(tmp_path / "d", per_class=4)
    with pytest.raises(ValueError, match="kind"):
        pack_dataset("mnist", data, tmp_path / "o")
    with pytest.raises(ValueError, match="shard_samples"):
        pack_dataset("imagefolder", data, tmp_path / "o", shard_samples=0)
    with pytest.raises(ValueError, match="crop"):
        pack_dataset("imagefolder", data, tmp_path / "o", crop=(8, 8))
    with pytest.raises(DatasetError, match="unknown layout"):
        pack_dataset("imagefolder", data, tmp_path / "o", layout="flat")
    assert not (tmp_path / "o").exists()
