"""Merkle tree math of RFC 9162 section 2.1 (identical to RFC 6962 section 2.1), SHA-256.

* leaf hash ``H(0x00 || data)``, interior node ``H(0x01 || left || right)``;
* a tree of n > 1 leaves splits at k, the largest power of two strictly below n;
* the empty tree's root is ``H("")``.

Public API (tools and tests rely on these exact signatures):

* ``tree_root(leaves) -> bytes``
* ``inclusion_proof(leaves, index) -> list[bytes]`` (RFC 9162 2.1.3.1 order: leaf to root)
* ``consistency_proof(leaves, old_size) -> list[bytes]`` (RFC 9162 2.1.4.1)
* ``verify_inclusion(leaf, index, size, proof, root) -> bool`` (RFC 9162 2.1.3.2)
* ``verify_consistency(old_size, new_size, old_root, new_root, proof) -> bool`` (RFC 9162 2.1.4.2)

``leaves``/``leaf`` are raw entry bytes (this module hashes them), hashes and proof elements are raw
32-byte ``bytes``. Builders raise ``ValueError`` for impossible requests (an index outside the tree);
verifiers return ``False`` for any malformed input and never raise.

Conventions for the degenerate sizes (as in transparency-dev/merkle's published test probes):
``verify_consistency(n, n, ...)`` holds iff the proof is empty and the roots are equal;
``verify_consistency(0, n > 0, ...)`` is False (an empty tree is a prefix of every tree; there is
nothing to prove, and ``consistency_proof`` refuses to build such a proof).

Building blocks for stores that keep hashes instead of leaves:

* :class:`MerkleFrontier` -- the compact range ``[0, n)``: the O(log n) roots of the perfect subtrees
  that the binary decomposition of n gives, with ``append(leaf_hash)`` (which reports the completed
  perfect-subtree nodes so a store can persist them) and ``root()``. Appending never re-hashes the log.
* :func:`inclusion_path` / :func:`consistency_path` build proofs from any ``subtree_hash(lo, hi)``
  function (for example one that reads stored node hashes), touching O(log n) subtrees.
* :func:`perfect_subtrees` names the stored perfect subtrees that make up a range ``[lo, hi)``, and
  :func:`fold_subtrees` combines their hashes into the range's MTH.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Sequence

HASH_SIZE = 32
LEAF_PREFIX = b"\x00"
NODE_PREFIX = b"\x01"
EMPTY_ROOT = hashlib.sha256(b"").digest()

SubtreeHash = Callable[[int, int], bytes]
"""``subtree_hash(lo, hi)``: the Merkle Tree Hash of leaves ``[lo, hi)`` (an RFC 9162 subtree)."""

_sha256 = hashlib.sha256


def leaf_hash(data: bytes) -> bytes:
    """RFC 9162 leaf hash of raw entry bytes."""
    return _sha256(LEAF_PREFIX + data).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    """RFC 9162 interior node hash."""
    return _sha256(NODE_PREFIX + left + right).digest()


def split_point(n: int) -> int:
    """k: the largest power of two strictly smaller than n (n >= 2)."""
    return 1 << ((n - 1).bit_length() - 1)


# -- the compact frontier ------------------------------------------------------------------------


class MerkleFrontier:
    """Compact range ``[0, size)``: one hash per set bit of ``size``, biggest subtree first.

    ``append`` costs O(1) amortized hashes (O(log n) worst case) and returns the perfect-subtree nodes
    it completed as ``(level, index, hash)`` with level >= 1 (the subtree covering leaves
    ``[index << level, (index + 1) << level)``). ``root`` folds the O(log n) hashes right to left.
    """

    __slots__ = ("size", "_hashes")

    def __init__(self) -> None:
        self.size = 0
        self._hashes: list[bytes] = []

    @classmethod
    def from_hashes(cls, size: int, hashes: Sequence[bytes]) -> MerkleFrontier:
        """Restore from ``size`` and its subtree roots in :func:`frontier_subtrees` order."""
        if size < 0 or len(hashes) != size.bit_count():
            raise ValueError(
                f"a frontier of size {size} has {max(size, 0).bit_count()} hashes, got {len(hashes)}"
            )
        frontier = cls()
        frontier.size = size
        frontier._hashes = list(hashes)
        return frontier

    @property
    def hashes(self) -> tuple[bytes, ...]:
        return tuple(self._hashes)

    def append(self, leaf: bytes) -> list[tuple[int, int, bytes]]:
        """Append one leaf *hash*; return the perfect subtrees (level >= 1) this completed."""
        completed: list[tuple[int, int, bytes]] = []
        index, h, level, n = self.size, leaf, 0, self.size
        while n & 1:
            h = node_hash(self._hashes.pop(), h)
            level += 1
            n >>= 1
            completed.append((level, index >> level, h))
        self._hashes.append(h)
        self.size += 1
        return completed

    def extend(self, leaves: Iterable[bytes]) -> None:
        for leaf in leaves:
            self.append(leaf)

    def root(self) -> bytes:
        return fold_subtrees(self._hashes)

    def copy(self) -> MerkleFrontier:
        return MerkleFrontier.from_hashes(self.size, self._hashes)


def frontier_subtrees(size: int) -> list[tuple[int, int]]:
    """``(level, index)`` of the perfect subtrees of the compact range ``[0, size)``, biggest first."""
    out, offset = [], 0
    for level in range(size.bit_length() - 1, -1, -1):
        if size >> level & 1:
            out.append((level, offset >> level))
            offset += 1 << level
    return out


def fold_subtrees(hashes: Sequence[bytes]) -> bytes:
    """MTH of consecutive perfect subtrees given biggest first (the empty tree's root for none)."""
    if not hashes:
        return EMPTY_ROOT
    r = hashes[-1]
    for h in reversed(hashes[:-1]):
        r = node_hash(h, r)
    return r


def perfect_subtrees(lo: int, hi: int) -> list[tuple[int, int]]:
    """``(level, index)`` of the perfect subtrees whose MTHs fold (right to left) into MTH(D[lo:hi]).

    Valid for any RFC 9162 subtree ``[lo, hi)``: an aligned perfect subtree, or a right-edge range
    whose ``lo`` is aligned to a power of two at least as large as ``hi - lo``.
    """
    out = []
    while lo < hi:
        n = hi - lo
        if n & (n - 1) == 0 and lo % n == 0:
            level = n.bit_length() - 1
            out.append((level, lo >> level))
            break
        k = split_point(n)
        level = k.bit_length() - 1
        out.append((level, lo >> level))
        lo += k
    return out


# -- proofs from a subtree-hash function -----------------------------------------------------------


def _check_size(name: str, value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}")


def inclusion_path(index: int, size: int, subtree_hash: SubtreeHash) -> list[bytes]:
    """RFC 9162 2.1.3.1 ``PATH(index, D[0:size])`` from ``subtree_hash(lo, hi)``, leaf to root."""
    _check_size("index", index)
    _check_size("size", size)
    if index >= size:
        raise ValueError(f"index {index} is outside a tree of size {size}")
    path: list[bytes] = []
    lo, hi = 0, size
    while hi - lo > 1:
        k = split_point(hi - lo)
        if index < lo + k:
            path.append(subtree_hash(lo + k, hi))
            hi = lo + k
        else:
            path.append(subtree_hash(lo, lo + k))
            lo += k
    path.reverse()
    return path


def consistency_path(old_size: int, new_size: int, subtree_hash: SubtreeHash) -> list[bytes]:
    """RFC 9162 2.1.4.1 ``PROOF(old_size, D[0:new_size])`` from ``subtree_hash(lo, hi)``."""
    _check_size("old_size", old_size)
    _check_size("new_size", new_size)
    if old_size > new_size:
        raise ValueError(f"old size {old_size} is larger than new size {new_size}")
    if old_size == new_size:
        return []
    if old_size == 0:
        raise ValueError("there is no consistency proof from an empty tree (it is a prefix of every tree)")
    # SUBPROOF(m, D[lo:hi], b), unrolled: descend, remembering the siblings to emit afterwards.
    proof: list[bytes] = []
    lo, hi, m, complete = 0, new_size, old_size, True
    while True:
        n = hi - lo
        if m == n:
            if not complete:
                proof.append(subtree_hash(lo, hi))
            break
        k = split_point(n)
        if m <= k:
            proof.append(subtree_hash(lo + k, hi))
            hi = lo + k
        else:
            proof.append(subtree_hash(lo, lo + k))
            lo += k
            m -= k
            complete = False
    proof.reverse()
    return proof


# -- the pure list API ------------------------------------------------------------------------------


def _level_hashes(leaf_hashes: list[bytes]) -> SubtreeHash:
    """subtree_hash over an in-memory list of leaf hashes (memoized per call site)."""
    memo: dict[tuple[int, int], bytes] = {}

    def mth(lo: int, hi: int) -> bytes:
        if hi - lo == 1:
            return leaf_hashes[lo]
        key = (lo, hi)
        found = memo.get(key)
        if found is None:
            k = split_point(hi - lo)
            found = memo[key] = node_hash(mth(lo, lo + k), mth(lo + k, hi))
        return found

    return mth


def memoized_subtree_hash(leaf_hashes: list[bytes]) -> SubtreeHash:
    """``subtree_hash(lo, hi)`` over an in-memory list of leaf hashes, each subtree hashed once (so
    the audit paths of all n leaves cost O(n) hashes)."""
    return _level_hashes(leaf_hashes)


def root_from_leaf_hashes(leaf_hashes: Iterable[bytes]) -> bytes:
    """MTH of a sequence of leaf hashes, in one pass with O(log n) memory."""
    frontier = MerkleFrontier()
    frontier.extend(leaf_hashes)
    return frontier.root()


def tree_root(leaves: Iterable[bytes]) -> bytes:
    """RFC 9162 Merkle Tree Hash of raw entries (``H("")`` for none)."""
    return root_from_leaf_hashes(leaf_hash(d) for d in leaves)


def inclusion_proof(leaves: Sequence[bytes], index: int) -> list[bytes]:
    """Audit path of entry ``index`` in the tree of all ``leaves`` (raw entries)."""
    hashes = [leaf_hash(d) for d in leaves]
    return inclusion_path(index, len(hashes), _level_hashes(hashes))


def consistency_proof(leaves: Sequence[bytes], old_size: int) -> list[bytes]:
    """Proof that the tree of ``leaves[:old_size]`` is a prefix of the tree of all ``leaves``."""
    hashes = [leaf_hash(d) for d in leaves]
    return consistency_path(old_size, len(hashes), _level_hashes(hashes))


# -- verifiers: bool, never raise -------------------------------------------------------------------


def _is_hash(value: object) -> bool:
    return isinstance(value, bytes) and len(value) == HASH_SIZE


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _is_proof(proof: object) -> bool:
    return isinstance(proof, list | tuple) and all(_is_hash(p) for p in proof)


def root_from_inclusion(leaf_hash_: bytes, index: int, size: int, proof: Sequence[bytes]) -> bytes | None:
    """The root that ``proof`` leads to from a leaf *hash* (RFC 9162 2.1.3.2), or None if malformed."""
    try:
        if not (_is_hash(leaf_hash_) and _is_count(index) and _is_count(size) and _is_proof(proof)):
            return None
        if index >= size:
            return None
        fn, sn, r = index, size - 1, leaf_hash_
        for p in proof:
            if sn == 0:
                return None
            if fn & 1 or fn == sn:
                r = node_hash(p, r)
                if not fn & 1:
                    while fn and not fn & 1:
                        fn >>= 1
                        sn >>= 1
            else:
                r = node_hash(r, p)
            fn >>= 1
            sn >>= 1
        return r if sn == 0 else None
    except Exception:  # noqa: BLE001 -- verifiers never raise
        return None


def verify_inclusion_hash(
    leaf_hash_: bytes, index: int, size: int, proof: Sequence[bytes], root: bytes
) -> bool:
    """Like :func:`verify_inclusion`, for a leaf hash instead of the raw entry."""
    if not _is_hash(root):
        return False
    return root_from_inclusion(leaf_hash_, index, size, proof) == root


def verify_inclusion(leaf: bytes, index: int, size: int, proof: Sequence[bytes], root: bytes) -> bool:
    """True iff raw entry ``leaf`` is entry ``index`` of the tree of ``size`` leaves with ``root``."""
    if not isinstance(leaf, bytes):
        return False
    return verify_inclusion_hash(leaf_hash(leaf), index, size, proof, root)


def verify_consistency(
    old_size: int, new_size: int, old_root: bytes, new_root: bytes, proof: Sequence[bytes]
) -> bool:
    """True iff ``proof`` shows the tree (old_size, old_root) is a prefix of (new_size, new_root)."""
    try:
        if not (
            _is_count(old_size)
            and _is_count(new_size)
            and _is_hash(old_root)
            and _is_hash(new_root)
            and _is_proof(proof)
        ):
            return False
        if old_size > new_size:
            return False
        if old_size == new_size:
            return len(proof) == 0 and old_root == new_root and (old_size > 0 or old_root == EMPTY_ROOT)
        if old_size == 0 or len(proof) == 0:
            return False
        path = list(proof)
        if old_size & (old_size - 1) == 0:  # a power of two: the old root is itself a node of the new tree
            path.insert(0, old_root)
        fn, sn = old_size - 1, new_size - 1
        while fn & 1:
            fn >>= 1
            sn >>= 1
        fr = sr = path[0]
        for c in path[1:]:
            if sn == 0:
                return False
            if fn & 1 or fn == sn:
                fr = node_hash(c, fr)
                sr = node_hash(c, sr)
                if not fn & 1:
                    while fn and not fn & 1:
                        fn >>= 1
                        sn >>= 1
            else:
                sr = node_hash(sr, c)
            fn >>= 1
            sn >>= 1
        return fr == old_root and sr == new_root and sn == 0
    except Exception:  # noqa: BLE001 -- verifiers never raise
        return False
