"""A receipt's group as a Merkle root and one inclusion proof: every member proves its own sample count
against one root, nothing else verifies, and the receipt stays small however large the group is (the
old member list was capped at 256 and crashed larger swarms)."""

from __future__ import annotations

import math
import random

import pytest

from protocol.averaging_group import (
    GroupMembership,
    averaging_group_id,
    group_membership,
    member_leaf,
    proves_membership,
)
from protocol.identity import Identity
from protocol.merkle import tree_root
from protocol.records import ContributionReceipt
from protocol.sealing import open_sealed, seal
from tests.protocol.factories import fake_peer_id, group_fields, peer_id_of, receipt


def _members(n: int, seed: int = 0) -> list[tuple[str, int]]:
    rng = random.Random(seed)
    return [(fake_peer_id(b"member-%d" % i), rng.randint(1, 512)) for i in range(n)]


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 13, 257, 513])  # every member builds its own proof: n² hashes
def test_every_member_proves_its_samples_against_one_root(n):
    members = _members(n)
    views = [group_membership(members, p) for p, _ in members]
    assert len({v.root for v in views}) == 1 and {v.size for v in views} == {n}
    assert sorted(v.index for v in views) == list(range(n))
    # The root is the RFC 9162 tree over the members' leaves in peer-id order, however they were given.
    assert views[0].root == tree_root([member_leaf(p, s) for p, s in sorted(members)]).hex()
    shuffled = members[:]
    random.Random(1).shuffle(shuffled)
    assert group_membership(shuffled, members[0][0]) == views[0]
    for (peer, samples), view in zip(members, views):
        assert proves_membership(peer, samples, view)
        assert len(view.proof) <= math.ceil(math.log2(n)) if n > 1 else view.proof == ()


def test_a_claim_the_group_did_not_count_does_not_verify():
    members = _members(9)
    peer, samples = members[4]
    view = group_membership(members, peer)
    assert not proves_membership(peer, samples + 1, view)  # more samples than the group saw
    assert not proves_membership(fake_peer_id(b"outsider"), samples, view)  # not in the group
    assert not proves_membership(members[5][0], members[5][1], view)  # another member's proof
    other_root = group_membership(_members(9, seed=2), _members(9, seed=2)[0][0]).root
    for forged in (
        GroupMembership(other_root, view.size, view.index, view.proof),
        GroupMembership(view.root, view.size, view.index + 1, view.proof),
        GroupMembership(view.root, view.size, view.index, view.proof[:-1]),
        GroupMembership(view.root, view.size, view.index, ("zz",) + view.proof[1:]),  # not hex: no raise
    ):
        assert not proves_membership(peer, samples, forged)
    # The size is bound by the group's id (a proof may verify for other sizes too).
    resized = GroupMembership(view.root, view.size + 1, view.index, view.proof)
    assert averaging_group_id("t", 1, resized, "ab" * 32) != averaging_group_id("t", 1, view, "ab" * 32)
    with pytest.raises(ValueError, match="not among"):
        group_membership(members, fake_peer_id(b"outsider"))
    with pytest.raises(ValueError, match="twice"):
        group_membership([*members, (peer, 1)], peer)


def test_a_receipt_of_a_group_far_past_the_old_256_limit_seals_and_opens_small():
    me = Identity.generate()
    members = [*_members(5000), (peer_id_of(me), 256)]
    view = group_membership(members, peer_id_of(me))
    wire = seal(receipt(me, 1, **group_fields(view)), me)
    opened = open_sealed(wire, ContributionReceipt).record
    assert opened.group_size == 5001 and proves_membership(opened.peer_id, opened.samples, view)
    assert len(wire) < 3 * 1024  # 13 proof hashes; a list of 5001 peer ids would be ~250 KB
