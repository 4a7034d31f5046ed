"""The quorum gate's reading of gathered metadata, in the bytes hivemind's ``step`` sends, and its
decision over a leader's group (the end-to-end case: tests/peer/averaging/test_cross_cohort_tree.py)."""

from __future__ import annotations

from types import SimpleNamespace

from hivemind.proto import averaging_pb2
from hivemind.utils import MSGPackSerializer

from hivemind_adapter.group_quorum import QuorumGate, listed_peers


def _data_for_gather(gather: object) -> bytes:
    """What hivemind's ``DecentralizedAverager.step`` sends for ``gather``."""
    return MSGPackSerializer.dumps([1.0, 0, MSGPackSerializer.dumps(gather)])


def _head(*peers: str) -> bytes:
    """A cohort head's cross-stage metadata: the contributors it carries."""
    return _data_for_gather({"cohorts": ["c"], "members": [{"peer": p, "samples": 4} for p in peers]})


def test_a_head_brings_the_peers_it_lists_and_a_cohort_member_itself():
    assert listed_peers(_head("a", "b")) == {"a", "b"}
    assert listed_peers(_data_for_gather({"peer": "c", "samples": 2})) == {"c"}


def test_metadata_in_any_other_form_brings_nobody():
    assert listed_peers(b"\x00not msgpack") == set()
    assert listed_peers(_data_for_gather([1, 2, 3])) == set()
    assert listed_peers(_data_for_gather({"members": [{"samples": 4}]})) == set()


def _leader(own: bytes, *followers: bytes) -> SimpleNamespace:
    """The parts of hivemind's Matchmaking the gate reads: the leader's step and its followers' requests."""
    return SimpleNamespace(
        step_control=SimpleNamespace(data_for_gather=own),
        current_followers={f"f{i}": averaging_pb2.JoinRequest(gather=g) for i, g in enumerate(followers)},
    )


def test_a_group_begins_only_with_enough_members_that_bring_a_quorum():
    members = ["a", "b", "c", "d", "e"]
    # hivemind asks `len(followers) + 1 >= min_group_size`
    assert 2 >= QuorumGate(_leader(_head("a", "b"), _head("c")), 2, members)  # 3 of 5
    assert not 2 >= QuorumGate(_leader(_head("a"), _head("c")), 2, members)  # 2 of 5: it waits on
    assert not 2 >= QuorumGate(_leader(_head("a", "b"), _head("c")), 3, members)  # too few members
    # peers outside the members (a stranger listed, or one that posted a departure notice) do not count
    assert not 2 >= QuorumGate(_leader(_head("a", "x"), _head("c", "y")), 2, members)


def test_a_leader_between_steps_holds_only_its_followers():
    matchmaking = _leader(b"")
    matchmaking.step_control = None
    matchmaking.current_followers = {"f": averaging_pb2.JoinRequest(gather=_head("a", "b", "c"))}
    assert 2 >= QuorumGate(matchmaking, 2, ["a", "b", "c", "d", "e"])
