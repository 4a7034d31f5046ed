"""What a receipt says about the averaging group it was in: a Merkle root, not a list.

A committed round's result is the exact mean over a set of contributors; every one of them holds the
same set (the commit quorum checks it by digest). The contributors are the leaves of an RFC 9162
Merkle tree (one leaf per contributor, sorted by peer id: ``{"peer": id, "samples": n}`` in canonical
JSON), and a receipt carries the tree's root and size, this peer's index and its inclusion proof:
O(log n) hashes, never capped by the group's size, which prove that the group the peer names counted
it with exactly the samples it claims. Receipts of the
same group name the same root; the aggregator compares roots, not lists
(:mod:`aggregator.contribution_checks`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from protocol.canonical import canonical_json
from protocol.merkle import inclusion_proof, tree_root, verify_inclusion

MAX_PROOF_HASHES = 64  # a tree of 2^64 leaves: no swarm comes near it


def member_leaf(peer_id: str, samples: int) -> bytes:
    """The tree leaf of one contributor (raw bytes; the Merkle math hashes them)."""
    return canonical_json({"peer": peer_id, "samples": samples})


@dataclass(frozen=True)
class GroupMembership:
    """One contributor's view of its group: what its receipt carries."""

    root: str  # hex of the RFC 9162 root over every contributor's leaf
    size: int  # how many contributors
    index: int  # this contributor's leaf
    proof: tuple[str, ...]  # hex hashes, leaf to root (RFC 9162 2.1.3.1)


def group_membership(members: Sequence[tuple[str, int]], peer_id: str) -> GroupMembership:
    """``members``: (peer id, samples) of every contributor; ``peer_id`` must be one of them.
    Sorted by peer id here, so every member builds the same tree from the same set."""
    ordered = sorted(members)
    ids = [p for p, _ in ordered]
    if len(set(ids)) != len(ids):
        raise ValueError("a contributor is listed twice")
    if peer_id not in ids:
        raise ValueError(f"{peer_id} is not among the group's contributors")
    leaves = [member_leaf(p, n) for p, n in ordered]
    index = ids.index(peer_id)
    proof = inclusion_proof(leaves, index)
    return GroupMembership(tree_root(leaves).hex(), len(leaves), index, tuple(h.hex() for h in proof))


def contributors_root(members: Sequence[tuple[str, int]]) -> tuple[str, int]:
    """The root (hex) and size of the tree over ``members`` (peer id, samples): what a commit names
    without being one of them."""
    ordered = sorted(members)
    if len({p for p, _ in ordered}) != len(ordered):
        raise ValueError("a contributor is listed twice")
    return tree_root([member_leaf(p, n) for p, n in ordered]).hex(), len(ordered)


def proves_membership(peer_id: str, samples: int, membership: GroupMembership) -> bool:
    """Whether ``membership`` proves that its group counted ``peer_id`` with ``samples``. Never raises."""
    try:
        return verify_inclusion(
            member_leaf(peer_id, samples),
            membership.index,
            membership.size,
            [bytes.fromhex(h) for h in membership.proof],
            bytes.fromhex(membership.root),
        )
    except (ValueError, TypeError):
        return False


def averaging_group_id(
    task_id: str, attempt: int, membership: GroupMembership | tuple[str, int], state_digest: str
) -> str:
    """The id of one averaging group: SHA-256 over the canonical JSON of the attempt, the contributors'
    root and count (every member with the sample count it declared) and the state they started from.
    Members that agree on all of it name the same group; a receipt whose claim differs names another
    one. The count is bound here, not by the proof: an RFC 9162 inclusion proof can also verify for
    some other tree sizes (a leaf's path only fixes the subtrees it passes)."""
    root, size = (membership.root, membership.size) if isinstance(membership, GroupMembership) else membership
    body = canonical_json(
        {"task": task_id, "attempt": attempt, "group": root, "size": size, "state": state_digest}
    )
    return hashlib.sha256(body).hexdigest()


def stage_check_token(
    task_id: str, attempt: int, stage: str, members: Sequence[str], result_digest: str
) -> str:
    """What a member of one all-reduce posts once it checked the result it received: SHA-256 over the
    canonical JSON of the attempt, the stage (e.g. ``cohort``, ``cross/1/0``), the members (sorted)
    and the digest of the result. Members that received the same bytes in the same group post the
    same token; a member that got another result, or was in another group, posts another."""
    body = canonical_json(
        {
            "task": task_id,
            "attempt": attempt,
            "stage": stage,
            "members": sorted(members),
            "result": result_digest,
        }
    )
    return hashlib.sha256(body).hexdigest()
