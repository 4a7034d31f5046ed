"""A task on an operator's image folder, end to end below the swarm: the task file's ``[data]`` is
packed into shards whose root is signed into the task; the aggregator serves them over real libp2p; a
peer fetches the shard list, refuses one that does not match the signed root, and downloads only its
share of the shards into its cache, from which its task reads the same images as the folder."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from aggregator.task_data import DataDesk, pack_into
from aggregator.task_publication import TaskFileError, build_task_spec
from hivemind_adapter.dht import speaker, start_dht, visible_maddrs
from hivemind_adapter.p2p import Endpoint
from peer.data_feed import PREFETCH_AT_START, DataFeed, DataUnavailable
from peer.progress_display import ProgressDisplay
from peer.swarm_view import ProgressBoard
from protocol.identity import Identity
from protocol.sealing import open_sealed, seal
from protocol.shards import DataManifest, manifest_bytes
from protocol.task_spec import TaskSpec
from tasks.shard_assignment import rounds_per_epoch, sample_pool
from tasks.shards.local import local_shard_task

LOOPBACK = ["/ip4/127.0.0.1/tcp/0"]


def _image_folder(root: Path, classes: int = 3, per_class: int = 20, size: int = 8) -> Path:
    rng = np.random.default_rng(0)
    for c in range(classes):
        folder = root / f"class{c}"
        folder.mkdir(parents=True)
        for i in range(per_class):
            pixels = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(folder / f"{i:03d}.png")
    return root


def _task_file(tmp_path: Path, data: Path, extra: str = "") -> Path:
    path = tmp_path / "task.toml"
    path.write_text(
        f'[task]\nid = "folder-test"\nname = "imagefolder"\nseed = 3\n'
        f'[swarm]\ntarget_samples_per_round = 16\nbatch_size = 8\nwidth_mult = "0.25"\nhead_channels = 32\n'
        f'[data]\npath = "{data}"\nshard_samples = 6\n{extra}'
    )
    return path


def _publish(tmp_path: Path, identity: Identity, data: Path) -> tuple[TaskSpec, Path]:
    agg_dir = tmp_path / "aggregator"
    spec = build_task_spec(
        str(_task_file(tmp_path, data)), identity, pack_data=pack_into(lambda _id: agg_dir)
    )
    return open_sealed(seal(spec, identity), TaskSpec).record, agg_dir


def test_a_task_file_packs_its_folder_and_signs_the_same_root_again(tmp_path):
    identity = Identity.generate()
    data = _image_folder(tmp_path / "images")
    spec, agg_dir = _publish(tmp_path, identity, data)
    assert spec.data is not None and spec.data.kind == "imagefolder"
    assert spec.data.train_samples + spec.data.val_samples == 60
    task, manifest = local_shard_task(spec.data, agg_dir / "data")
    assert task.num_classes == 3 and len(task.train_set) == spec.data.train_samples
    again = build_task_spec(
        str(_task_file(tmp_path, data)), identity, pack_data=pack_into(lambda _id: tmp_path / "again")
    )
    assert again.data.root == spec.data.root


def test_bad_data_stops_the_publication_with_one_line_and_leaves_nothing(tmp_path):
    identity = Identity.generate()
    data = _image_folder(tmp_path / "images")
    broken = data / "class1" / "005.png"
    broken.write_bytes(b"not a png at all")
    agg_dir = tmp_path / "aggregator"
    with pytest.raises(TaskFileError) as err:
        build_task_spec(str(_task_file(tmp_path, data)), identity, pack_data=pack_into(lambda _id: agg_dir))
    assert "\n" not in str(err.value) and "005.png" in str(err.value)
    assert not (agg_dir / "data" / "manifest.json").exists()
    assert not list((agg_dir / "data").rglob("*.shard")) if (agg_dir / "data").exists() else True


@pytest.mark.parametrize(
    "toml, message",
    [
        ('[task]\nname = "imagefolder"\n', "your own data"),
        ('[task]\nname = "digits"\n[data]\npath = "/x"\n', "not 'digits'"),
        ('[task]\nname = "imagefolder"\n[data]\npath = "/x"\nsize = 3\n', "unknown key"),
        ('[task]\nname = "imagefolder"\n[data]\npath = "/x"\nval_fraction = 2\n', "val_fraction"),
    ],
)
def test_data_sections_that_cannot_work_are_refused_before_packing(tmp_path, toml, message):
    path = tmp_path / "task.toml"
    path.write_text(toml)
    packed = []
    with pytest.raises(TaskFileError, match=message):
        build_task_spec(str(path), Identity.generate(), pack_data=lambda *a: packed.append(a))
    assert packed == []


@pytest.fixture()
def served(tmp_path):
    """An aggregator node serving a packed image folder, and a peer node."""
    identity = Identity.generate()
    spec, agg_dir = _publish(tmp_path, identity, _image_folder(tmp_path / "images"))
    first = start_dht(host_maddrs=LOOPBACK)
    second = start_dht(host_maddrs=LOOPBACK, initial_peers=visible_maddrs(first))
    agg_end, peer_end = Endpoint(first, "aggregator"), Endpoint(second, "peer")
    desk = DataDesk(agg_end, spec, agg_dir)
    feeds = []

    def feed(aggregators, cache_bytes=1 << 30, task=spec) -> DataFeed:
        peer_identity = Identity.generate()
        board = ProgressBoard(second, task.task_id, speaker(second, peer_identity))
        f = DataFeed(peer_end, task, board, lambda: aggregators, peer_end.peer_id, tmp_path / f"peer{len(feeds)}",
                     cache_bytes, ProgressDisplay(interactive=False))  # fmt: skip
        feeds.append(f)
        return f

    try:
        yield spec, desk, agg_end.peer_id, feed
    finally:
        for f in feeds:
            f.close()
        desk.close()
        for end in (agg_end, peer_end):
            end.close()
        second.shutdown()
        first.shutdown()


def test_a_peer_downloads_only_its_share_and_reads_the_folders_images(served):
    spec, desk, aggregator, feed = served
    data = feed([aggregator])
    manifest = data.open(timeout=30)
    roster = [data.peer_id, "12D3KooWsomebodyElse1", "12D3KooWsomebodyElse2"]
    # before the roster is known: the first shards of the share it would have alone
    at_start = {e.digest for e in data.share(0, [])[0][:PREFETCH_AT_START]}
    last_round = rounds_per_epoch(spec.data.train_samples, spec.params.target_samples_per_round) - 1
    current, upcoming = data.share(last_round, roster)  # the epoch's last round: the next one's too
    assert upcoming and data.share(0, roster)[1] == ()  # not prefetched before the last quarter
    shards = data.shards_for_round(last_round, roster, threading.Event())
    assert shards and set(shards) <= {e.index for e in current}
    assert data.downloader.wait(list(current) + list(upcoming), timeout=30)
    deadline = time.monotonic() + 30
    while (p := data.downloader.progress()).shards_done < p.shards_wanted:  # nothing left in flight
        assert time.monotonic() < deadline
        time.sleep(0.1)
    held = set(data.cache.digests())
    train = manifest.split("train")
    share = {e.digest for e in (*current, *upcoming)}
    assert share <= held <= share | at_start
    assert len(held) < len(train), "a peer of three never needs the whole dataset"
    assert desk.bytes_served() == sum(e.size for e in manifest.shards if e.digest in held)
    # the peer's task reads, from its cache, the same samples as the aggregator's packed copy
    peer_task, _ = local_shard_task(spec.data, data.directory)
    pool = sample_pool(train, [e.index for e in current])
    for i in pool[:5]:
        mine, theirs = peer_task.train_set[int(i)], desk.task.train_set[int(i)]
        assert torch.equal(mine[0], theirs[0]) and mine[1] == theirs[1]
    bitmap, served_bytes, fetched = data.holdings()
    assert fetched == sum(e.size for e in manifest.shards if e.digest in held) and served_bytes == 0
    assert bitmap


def test_a_shard_list_that_does_not_match_the_signed_root_is_refused(served):
    spec, desk, aggregator, feed = served
    # a source serving another list under the task's root: one entry's size changed
    entries = list(desk.manifest.shards)
    entries[0] = entries[0].model_copy(update={"size": entries[0].size + 1})
    desk.manifest_server.put(spec.data.root, manifest_bytes(DataManifest(shards=tuple(entries))))
    data = feed([aggregator])
    with pytest.raises(DataUnavailable, match="does not match the task's signed"):
        data.open(timeout=3)
    assert data.cache.digests() == []
