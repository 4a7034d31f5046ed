"""The cohort directory: every cohort's page checks out under the signed header alone, wherever it
came from, and nothing else does (a member added, dropped or re-keyed; a page of another cohort's
place or another epoch)."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest

from protocol.cohort_directory import (
    CohortDirectory,
    CohortPage,
    DirectoryError,
    DirectoryHeader,
    DirectoryMember,
    NotInDirectory,
    PageRequest,
    WrongDirectory,
    governing,
    headers_reply,
    page_request,
    parse_headers_reply,
    parse_page_request,
)
from protocol.identity import Identity
from protocol.merkle import tree_root
from protocol.sealing import open_sealed, seal

TASK = "digits-test"
AGGREGATOR = Identity.generate()


def _cohorts(rng: random.Random, n: int, cohorts: int) -> dict[str, list[DirectoryMember]]:
    out: dict[str, list[DirectoryMember]] = {}
    for i in range(n):
        member = DirectoryMember(f"12D3KooW{i:040d}", rng.randbytes(32).hex())
        out.setdefault(f"net-{rng.randrange(cohorts):04d}", []).append(member)
    return out


@pytest.mark.parametrize("n", [1, 2, 3, 7, 8, 9, 100, 1000])
def test_every_cohort_page_checks_out_under_the_signed_header_and_they_hold_every_member_once(n):
    rng = random.Random(n)
    cohorts = max(1, n // 6)
    directory = CohortDirectory(TASK, epoch=3, first_attempt=40, cohorts=_cohorts(rng, n, cohorts))
    sealed = open_sealed(seal(directory.header(timestamp=1_700_000_000_000), AGGREGATOR), DirectoryHeader)
    assert sealed.public_key == AGGREGATOR.public_key
    header = sealed.record
    assert header.size == n and header.cohorts == len(directory.names)
    # the root is RFC 9162's Merkle tree hash of the pages' leaves in cohort-name order
    pages = [CohortPage.from_bytes(directory.page(name).to_bytes()) for name in directory.names]
    assert bytes.fromhex(header.root) == tree_root(p.leaf() for p in pages)
    seen = []
    for page in pages:
        seen += page.check(header)
        assert len(page.path) <= max(0, math.ceil(math.log2(header.cohorts)))
    assert len(seen) == len(set(seen)) == n


def test_a_page_with_a_member_added_dropped_rekeyed_or_in_another_place_is_refused():
    rng = random.Random(7)
    directory = CohortDirectory(TASK, epoch=3, first_attempt=40, cohorts=_cohorts(rng, 50, 8))
    header = directory.header(timestamp=1)
    page = directory.page(directory.names[2])
    first = page.members[0]
    forged = {
        "added": replace(page, members=page.members + (DirectoryMember("12D3KooWsybil", "ab" * 32),)),
        "dropped": replace(page, members=page.members[1:]),
        "rekeyed": replace(page, members=(DirectoryMember(first.peer_id, "cd" * 32),) + page.members[1:]),
        "renamed": replace(page, cohort=directory.names[3]),
        "moved": replace(page, index=3),
    }
    for bad in forged.values():
        with pytest.raises(NotInDirectory, match=f"is not page {bad.index} of directory epoch 3"):
            bad.check(header)
    with pytest.raises(WrongDirectory, match="page of digits-test epoch 2, not digits-test epoch 3"):
        replace(page, epoch=2).check(header)
    # the next epoch, one peer more: the old pages do not hold under its header
    cohorts = {name: list(directory.cohorts[name]) for name in directory.names}
    cohorts[directory.names[0]].append(DirectoryMember("12D3KooWlater", "ef" * 32))
    later = CohortDirectory(TASK, 3, 60, cohorts).header(timestamp=2)
    with pytest.raises(NotInDirectory):
        directory.page(directory.names[0]).check(later)


@pytest.mark.parametrize(
    "data",
    [
        b"not json",
        b"[]",
        b'{"task":"t","epoch":1,"cohort":"c","members":[],"index":0}',
        b'{"task":"t","epoch":"1","cohort":"c","members":[],"index":0,"path":[]}',
        b'{"task":"t","epoch":1,"cohort":"c","members":[],"index":-1,"path":[]}',
        b'{"task":"t","epoch":1,"cohort":"c","members":[["p"]],"index":0,"path":[]}',
        b'{"task":"t","epoch":1,"cohort":"c","members":[["p",3]],"index":0,"path":[]}',
        b'{"task":"t","epoch":1,"cohort":"c","members":[],"index":0,"path":["zz"]}',
        b'{"task":"t","epoch":1,"cohort":"c","members":[],"index":0,"path":["ab"]}',
        b'{"task":"t","epoch":true,"cohort":"c","members":[],"index":0,"path":[]}',
    ],
)
def test_a_malformed_page_is_refused_in_one_line(data):
    with pytest.raises(DirectoryError) as refused:
        CohortPage.from_bytes(data)
    assert "\n" not in str(refused.value) and str(refused.value)


def test_an_attempt_is_governed_by_the_latest_directory_that_starts_by_then():
    headers = [
        CohortDirectory(TASK, e, first, {}).header(timestamp=e)
        for e, first in ((1, 0), (2, 30), (3, 30), (4, 90))
    ]
    assert governing(headers, 0).epoch == 1 and governing(headers, 29).epoch == 1
    assert governing(headers, 30).epoch == 3  # two start at 30: the newer epoch
    assert governing(headers, 89).epoch == 3 and governing(headers, 10**9).epoch == 4
    assert governing(headers[1:], 29) is None


def test_a_peer_is_in_one_cohort_of_a_directory_and_a_cohort_has_a_member():
    twice = DirectoryMember("12D3KooWtwice", "ab" * 32)
    with pytest.raises(ValueError, match="one cohort"):
        CohortDirectory(TASK, 1, 0, {"a": [twice], "b": [twice]})
    with pytest.raises(ValueError, match="has a member"):
        CohortDirectory(TASK, 1, 0, {"a": []})


def test_a_page_request_names_a_cohort_a_peer_or_a_leaf_index_and_a_malformed_one_is_refused():
    assert parse_page_request(page_request(7, cohort="host-ab")) == PageRequest(7, cohort="host-ab")
    assert parse_page_request(page_request(7, peer_id="12D3KooWx")) == PageRequest(7, peer_id="12D3KooWx")
    assert parse_page_request(page_request(7, index=12)) == PageRequest(7, index=12)
    for bad in (
        b"7",
        b"x #1",
        b"7 #",
        b"7 #-1",
        b"7 #1x",
        b"7 #" + b"9" * 19,
        "7 #²".encode(),
        "²".encode() + b" c",
    ):
        with pytest.raises(DirectoryError):
            parse_page_request(bad)
    with pytest.raises(ValueError):
        page_request(7, cohort="a", index=1)


def test_a_headers_reply_carries_sealed_headers_and_a_malformed_one_is_refused():
    wires = [seal(CohortDirectory(TASK, e, e, {}).header(timestamp=e), AGGREGATOR) for e in (1, 2)]
    assert parse_headers_reply(headers_reply(wires)) == wires
    for bad in (
        b"",
        b"[]",
        b'{"headers": "ab"}',
        b'{"headers": ["zz"]}',
        b'{"headers": [' + b'"ab",' * 16 + b'"ab"]}',
    ):
        with pytest.raises(DirectoryError):
            parse_headers_reply(bad)
