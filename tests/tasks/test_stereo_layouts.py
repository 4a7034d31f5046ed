"""Stereo data sets in their real layouts (KITTI 2015 / 2012, Scene Flow, Middlebury 2014), packed into
shards and read back: disparity and valid mask as the source files say, the local ``stereo-folder``
task agreeing with the shards, and broken data sets refused in one line naming the file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from supernet.workload import workload_for
from tasks import available_tasks, get_task
from tasks.registry import DatasetError
from tasks.shards.dataset import ShardDirectory, shard_task
from tasks.shards.pack import pack_dataset, training_order
from tasks.stereo.io import read_image, read_kitti_disparity, read_pfm, write_kitti_disparity, write_pfm
from tests.tasks.test_shard_packing import assert_refused, listing

SIZE = (70, 140)  # height, width: the default crop is 64 x 128
TINY = dict(unit_channels=(8, 8, 8, 8, 8, 16), batch_size=2, num_subnets=2, bn_calibration_batches=1)


def _pair(rng, size=SIZE, invalid=0.2):
    h, w = size
    left = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    right = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    disparity = rng.uniform(0.5, 40.0, (h, w)).astype(np.float32)
    holes = rng.random((h, w)) < invalid
    return left, right, disparity, holes


def make_kitti(root: Path, dirs=("image_2", "image_3", "disp_occ_0"), count=6, seed=0) -> Path:
    rng = np.random.default_rng(seed)
    folders = [root / "training" / d for d in dirs]
    for folder in folders:
        folder.mkdir(parents=True)
    for i in range(count):
        left, right, disparity, holes = _pair(rng)
        name = f"{i:06d}_10.png"
        Image.fromarray(left).save(folders[0] / name)
        Image.fromarray(right).save(folders[1] / name)
        write_kitti_disparity(folders[2] / name, disparity, ~holes)  # holes are stored as 0
        Image.fromarray(left).save(folders[0] / f"{i:06d}_11.png")  # the next frame: not a sample
    return root


def make_sceneflow(root: Path, seed=0) -> Path:
    rng = np.random.default_rng(seed)
    for split, sequences in (("TRAIN", ("A/0000", "B/0001")), ("TEST", ("A/0002",))):
        for sequence in sequences:
            for frame, order in (("0006", "<"), ("0007", ">")):
                left, right, disparity, holes = _pair(rng, invalid=0.05)
                disparity[holes] = -1.0  # negative: invalid
                base = root / "frames_cleanpass" / split / sequence
                for side, image in (("left", left), ("right", right)):
                    (base / side).mkdir(parents=True, exist_ok=True)
                    Image.fromarray(image).save(base / side / f"{frame}.png")
                gt = root / "disparity" / split / sequence / "left"
                gt.mkdir(parents=True, exist_ok=True)
                write_pfm(gt / f"{frame}.pfm", disparity, byteorder=order)
    return root


def make_middlebury(root: Path, seed=0) -> Path:
    rng = np.random.default_rng(seed)
    for scene, size in (
        ("Adirondack", SIZE),
        ("Jadeplant", (80, 150)),
        ("Motorcycle", SIZE),
        ("Piano", (72, 200)),
    ):
        left, right, disparity, holes = _pair(rng, size)
        disparity[holes] = np.inf  # Middlebury: unknown
        (root / scene).mkdir(parents=True)
        Image.fromarray(left).save(root / scene / "im0.png")
        Image.fromarray(right).save(root / scene / "im1.png")
        write_pfm(root / scene / "disp0.pfm", disparity)
    return root


BUILDERS = {
    "kitti2015": make_kitti,
    "kitti2012": lambda root: make_kitti(root, ("colored_0", "colored_1", "disp_occ")),
    "sceneflow": make_sceneflow,
    "middlebury": make_middlebury,
}


def _reference(left: Path, gt: Path, crop=(64, 128)):
    """The sample read independently from the source files, cropped bottom-centre."""
    if gt.suffix == ".pfm":
        disparity = read_pfm(gt)
        valid = np.isfinite(disparity) & (disparity >= 0)
    else:
        disparity, valid = read_kitti_disparity(gt)
    h, w = disparity.shape
    x0 = (w - crop[1]) // 2
    window = (slice(h - crop[0], h), slice(x0, x0 + crop[1]))
    image = torch.from_numpy(read_image(left)[window]).permute(2, 0, 1)
    return image, torch.from_numpy(np.where(valid, disparity, 0)[window]), torch.from_numpy(valid[window])


@pytest.mark.parametrize("layout", list(BUILDERS))
def test_each_layout_packs_and_reads_back_its_ground_truth(tmp_path, layout):
    data = BUILDERS[layout](tmp_path / "data")
    packed = pack_dataset(
        "stereo-folder", data, tmp_path / "out", layout=layout, val_fraction=0.25, shard_samples=2
    )
    spec = packed.spec
    assert spec.kind == "stereo-folder" and spec.layout == layout and spec.classes == ()
    assert spec.sample_shape == (64, 128)
    expected = {"sceneflow": (4, 2), "middlebury": (3, 1)}.get(layout, (4, 2))
    assert (spec.train_samples, spec.val_samples) == expected
    assert {e.format for e in packed.manifest.shards} == {f"stereo/{layout}"}
    task = shard_task(spec, packed.manifest, ShardDirectory(packed.directory))
    local = get_task("stereo-folder", str(data), layout=layout, val_fraction=0.25)
    assert task.input_size == local.input_size == (3, 64, 128) and task.metric_name == "epe"
    assert not task.higher_is_better and task.num_classes is None
    shuffled = training_order(spec.train_samples, 0)
    for ours, theirs, order in (
        (task.train_set, local.train_set, shuffled),
        (task.val_set, local.val_set, list(range(spec.val_samples))),
    ):
        assert len(ours) == len(theirs)
        for i in range(len(ours)):
            sample, left_path, gt_path = ours[i], theirs.pairs[order[i]][0], theirs.pairs[order[i]][2]
            image, disparity, valid = _reference(left_path, gt_path)
            assert sample["left"].shape == sample["right"].shape == (3, 64, 128)
            assert torch.equal(sample["left"], image)
            assert torch.equal(sample["disparity"][0], disparity) and torch.equal(sample["valid"][0], valid)
            assert 0 < valid.sum() < valid.numel()  # both kinds of pixel in the crop
            assert all(torch.equal(sample[k], theirs[order[i]][k]) for k in sample)
    if layout == "sceneflow":  # TRAIN is train, TEST is validation
        assert all("TEST" in str(p[0]) for p in local.val_set.pairs)
        assert all("TRAIN" in str(p[0]) for p in local.train_set.pairs)
    if layout == "middlebury":  # sizes vary: the shard's decoded shape is the largest of its pairs
        assert max(e.decoded_shape for e in packed.manifest.shards) >= (72, 150)


def test_kitti_may_be_given_as_its_training_folder_and_repacks_identically(tmp_path):
    data = make_kitti(tmp_path / "kitti")
    a = pack_dataset("stereo-folder", data, tmp_path / "a", layout="kitti2015", seed=7)
    b = pack_dataset("stereo-folder", data / "training", tmp_path / "b", layout="kitti2015", seed=7)
    assert a.spec == b.spec and listing(tmp_path / "a") == listing(tmp_path / "b")
    assert a.spec.train_samples + a.spec.val_samples == 6 and a.spec.val_samples == 1
    cropped = pack_dataset("stereo-folder", data, tmp_path / "c", layout="kitti2015", seed=7, crop=(64, 64))
    assert cropped.spec.sample_shape == (64, 64) and cropped.spec.root == a.spec.root  # shards keep the files


def test_missing_partner_files_are_named(tmp_path):
    data = make_kitti(tmp_path / "kitti")
    out = tmp_path / "out"
    out.mkdir()
    missing = data / "training" / "image_3" / "000002_10.png"
    missing.unlink()
    assert_refused("stereo-folder", data, out, f"has no right image {missing}", layout="kitti2015")
    flow = make_sceneflow(tmp_path / "flow")
    gone = flow / "disparity" / "TEST" / "A" / "0002" / "left" / "0007.pfm"
    gone.unlink()
    assert_refused("stereo-folder", flow, out, f"has no disparity file {gone}", layout="sceneflow")
    mb = make_middlebury(tmp_path / "mb")
    (mb / "Piano" / "disp0.pfm").unlink()
    assert_refused(
        "stereo-folder", mb, out, f"has no disparity file {mb / 'Piano' / 'disp0.pfm'}", layout="middlebury"
    )


def test_disparity_without_a_valid_pixel_is_named(tmp_path):
    data = make_kitti(tmp_path / "kitti")
    out = tmp_path / "out"
    empty = data / "training" / "disp_occ_0" / "000004_10.png"
    write_kitti_disparity(empty, np.zeros(SIZE), np.zeros(SIZE, bool))  # all stored as 0
    assert_refused(
        "stereo-folder", data, out, f"{empty} has no valid disparity", layout="kitti2015", shard_samples=1
    )
    mb = make_middlebury(tmp_path / "mb")
    unknown = mb / "Motorcycle" / "disp0.pfm"
    write_pfm(unknown, np.full(SIZE, np.inf, np.float32))
    assert_refused("stereo-folder", mb, out, f"{unknown} has no valid disparity", layout="middlebury")


def test_bad_files_sizes_layouts_and_crops_are_refused_in_one_line(tmp_path):
    out = tmp_path / "out"
    data = make_kitti(tmp_path / "kitti")
    assert_refused("stereo-folder", data, out, "layout None is not one of kitti2015")
    assert_refused("stereo-folder", data, out, "has no colored_0, colored_1, disp_occ/", layout="kitti2012")
    assert_refused("stereo-folder", tmp_path / "nothing", out, "is not a directory", layout="sceneflow")
    assert_refused(
        "stereo-folder",
        data,
        out,
        "crop 128x128 (height x width) is larger than",
        layout="kitti2015",
        crop=(128, 128),
    )
    assert_refused(
        "stereo-folder", data, out, "must be positive multiples of 64", layout="kitti2015", crop=(60, 64)
    )
    right = data / "training" / "image_3" / "000001_10.png"
    Image.new("RGB", (141, 70)).save(right)
    assert_refused("stereo-folder", data, out, f"{right} is 141x70 but", layout="kitti2015")
    right.write_bytes(b"broken")
    assert_refused("stereo-folder", data, out, f"{right}: cannot read as an image", layout="kitti2015")
    small = make_middlebury(tmp_path / "mb")
    for name in ("im0.png", "im1.png"):
        Image.new("RGB", (140, 40)).save(small / "Piano" / name)
    write_pfm(small / "Piano" / "disp0.pfm", np.ones((40, 140), np.float32))
    assert_refused("stereo-folder", small, out, "at least 64x64 pixels", layout="middlebury")
    with pytest.raises(DatasetError, match="at least 64x64"):
        get_task("stereo-folder", str(small), layout="middlebury")


def test_one_workload_step_on_a_stereo_shard_task(tmp_path):
    assert "stereo-folder" in available_tasks()
    data = make_kitti(tmp_path / "kitti")
    packed = pack_dataset("stereo-folder", data, tmp_path / "out", layout="kitti2015", crop=(64, 64))
    task = shard_task(packed.spec, packed.manifest, ShardDirectory(packed.directory), max_disparity=30.0)
    workload = workload_for("stereo-folder", TINY, task=task)
    assert workload.family == "stereo" and workload.input_size == (64, 64)
    net = workload.build()
    generator = torch.Generator().manual_seed(0)
    batch = workload.batch([0, 3], generator)
    assert batch["left"].shape == (2, 3, 64, 64) and batch["valid"].dtype == torch.bool
    assert batch["disparity"][batch["valid"]].max() <= 30.0
    stats = workload.accumulate(
        net, batch, [net.largest_config(), net.smallest_config()], torch.device("cpu"), generator
    )
    assert stats["samples"] == 2 and np.isfinite(stats["loss"])
