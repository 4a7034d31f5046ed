"""The signed shard list: one root per list, any change to an entry is caught, and the records that
carry shards (tasks, receipts, progress) keep their invariants."""

from __future__ import annotations

import pytest

from protocol.identity import Identity
from protocol.sealing import open_sealed, seal
from protocol.shards import (
    DataManifest,
    DataSpec,
    ManifestMismatch,
    ShardEntry,
    check_manifest,
    held_shards,
    holdings_bitmap,
    manifest_bytes,
    manifest_root,
    parse_manifest,
)
from protocol.task_spec import TaskSpec
from tests.protocol.factories import receipt, task_spec


def _manifest() -> DataManifest:
    entries = []
    for i, (split, first, samples) in enumerate([("train", 0, 5), ("train", 5, 3), ("val", 0, 4)]):
        entries.append(
            ShardEntry(index=i, split=split, digest=f"{i + 1:064x}", size=100 + i, first_sample=first,
                       samples=samples, format="image/png", decoded_shape=(3, 8, 8), decoded_bytes=samples * 192)
        )  # fmt: skip
    return DataManifest(shards=tuple(entries))


def _spec(manifest: DataManifest) -> DataSpec:
    return DataSpec(kind="imagefolder", layout="tree", root=manifest_root(manifest.shards), shards=3,
                    train_samples=8, val_samples=4, sample_shape=(3, 8, 8), classes=("a", "b"), bytes=303)  # fmt: skip


def test_a_manifest_travels_as_canonical_bytes_and_checks_against_its_spec():
    manifest = _manifest()
    raw = manifest_bytes(manifest)
    assert parse_manifest(raw) == manifest
    check_manifest(parse_manifest(raw), _spec(manifest))


@pytest.mark.parametrize(
    "change, reason",
    [
        ({"size": 999}, "root"),
        ({"digest": "f" * 64}, "root"),
        ({"first_sample": 6}, "root"),
    ],
)
def test_a_changed_entry_does_not_match_the_signed_root(change, reason):
    manifest = _manifest()
    spec = _spec(manifest)
    tampered = list(manifest.shards)
    tampered[1] = tampered[1].model_copy(update=change)
    with pytest.raises(ManifestMismatch, match=reason):
        check_manifest(DataManifest(shards=tuple(tampered)), spec)


def test_a_list_with_its_own_root_but_other_totals_is_refused():
    manifest = _manifest()
    spec = _spec(manifest).model_copy(update={"train_samples": 9})
    with pytest.raises(ManifestMismatch, match="train shards hold 8 samples"):
        check_manifest(manifest, spec)


def test_malformed_manifest_bytes_give_one_line():
    with pytest.raises(ManifestMismatch) as err:
        parse_manifest(b'{"shards": [{"index": "x"}]}')
    assert "\n" not in str(err.value)


def test_holdings_bitmaps_round_trip():
    for held in [set(), {0}, {7, 8}, {0, 3, 64, 1000}]:
        assert held_shards(holdings_bitmap(held)) == held


def test_a_task_with_data_seals_and_opens():
    identity = Identity.generate()
    manifest = _manifest()
    spec = task_spec(identity, task="imagefolder").model_copy(update={"data": _spec(manifest)})
    opened = open_sealed(seal(spec, identity), TaskSpec)
    assert opened.record.data.root == manifest_root(manifest.shards)


def test_a_receipt_lists_its_data_shards_sorted_and_once():
    identity = Identity.generate()
    assert receipt(identity, 1, data_shards=(1, 4)).data_shards == (1, 4)
    for bad in [(4, 1), (1, 1)]:
        with pytest.raises(ValueError, match="data_shards"):
            receipt(identity, 1, data_shards=bad)
