"""The cohort directory: who takes part in a span of attempts, and in which cohort, as one aggregator
signed it, so that every peer counts against the same roster and reads it in a constant number of
lookups.

An aggregator signs a :class:`DirectoryHeader`: the task, the epoch, the first attempt it governs,
how many members and cohorts, and the RFC 9162 Merkle root over the cohorts' pages in cohort-name
order (each leaf: :meth:`CohortPage.leaf`, the cohort's name and its members' peer ids and keys).
A :class:`CohortPage` carries its audit path (about log2 of the cohort count hashes), so whoever
holds the header checks a page alone, wherever it came from: from the aggregator, a cohort mate, or
inside a certificate. The directory of attempt ``a`` is the one with the greatest ``first_attempt``
at most ``a`` (:func:`governing`).

Pure Python: no torch, no hivemind.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

from protocol.canonical import canonical_json
from protocol.fields import Hex32, Int53, Name
from protocol.merkle import EMPTY_ROOT, inclusion_path, leaf_hash, memoized_subtree_hash, verify_inclusion
from protocol.sealing import SealedRecord

__all__ = [
    "CohortDirectory",
    "CohortPage",
    "DirectoryError",
    "DirectoryHeader",
    "DirectoryMember",
    "HEADERS_REQUEST",
    "NotInDirectory",
    "PageRequest",
    "WrongDirectory",
    "governing",
    "headers_reply",
    "page_request",
    "parse_headers_reply",
    "parse_page_request",
]

MAX_PATH = 64  # audit path hashes a page may carry (a tree of 2^64 cohorts)
MAX_PAGE_MEMBERS = 4096  # members one page may list


class DirectoryError(ValueError):
    """A page that does not belong to the directory it was checked against, or is no page."""


class WrongDirectory(DirectoryError):
    """Of another task or epoch than the header's."""


class NotInDirectory(DirectoryError):
    """A page the header's root does not hold where the page says."""


class DirectoryHeader(SealedRecord):
    """ "For ``task_id``, from attempt ``first_attempt`` on, the ``size`` members are those of the
    ``cohorts`` pages under ``root``", sealed by an aggregator key of the task at ``timestamp``."""

    RECORD_TYPE: ClassVar[str] = "cohort-directory"
    MAX_WIRE_BYTES: ClassVar[int] = 1024

    task_id: Name
    epoch: Int53
    first_attempt: Int53
    size: Int53
    cohorts: Int53
    root: Hex32
    timestamp: Int53


@dataclass(frozen=True, order=True)
class DirectoryMember:
    """One member: its libp2p peer id and MANTA key (hex)."""

    peer_id: str
    public_key: str


@dataclass(frozen=True)
class CohortPage:
    """Cohort ``cohort``'s members in one epoch's directory: leaf ``index`` of its tree."""

    task_id: str
    epoch: int
    cohort: str
    members: tuple[DirectoryMember, ...]
    index: int
    path: tuple[bytes, ...]

    def leaf(self) -> bytes:
        """The bytes the directory's Merkle tree hashes for this cohort (canonical JSON)."""
        return canonical_json(
            {"cohort": self.cohort, "members": [[m.peer_id, m.public_key] for m in self.members]}
        )

    def check(self, header: DirectoryHeader) -> tuple[DirectoryMember, ...]:
        """The cohort's members if the header's root holds this page at its index;
        WrongDirectory or NotInDirectory says why not."""
        if (self.task_id, self.epoch) != (header.task_id, header.epoch):
            raise WrongDirectory(
                f"page of {self.task_id} epoch {self.epoch}, not {header.task_id} epoch {header.epoch}"
            )
        root = bytes.fromhex(header.root)
        if not verify_inclusion(self.leaf(), self.index, header.cohorts, list(self.path), root):
            raise NotInDirectory(
                f"cohort {self.cohort} as listed is not page {self.index} of directory epoch {header.epoch}"
            )
        return self.members

    def to_bytes(self) -> bytes:
        value = {
            "task": self.task_id, "epoch": self.epoch, "cohort": self.cohort,
            "members": [[m.peer_id, m.public_key] for m in self.members],
            "index": self.index, "path": [h.hex() for h in self.path],
        }  # fmt: skip
        return json.dumps(value, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> CohortPage:
        """DirectoryError (one line) if ``data`` is no page (whether it is in a directory is
        :meth:`check`'s question)."""
        try:
            value = json.loads(data)
        except (ValueError, UnicodeDecodeError):
            raise DirectoryError("a cohort page is JSON") from None
        fields = {"task", "epoch", "cohort", "members", "index", "path"}
        if not isinstance(value, dict) or set(value) != fields:
            raise DirectoryError("a cohort page is {" + ", ".join(sorted(fields)) + "}")
        task, epoch, cohort, members, index, path = (
            value[k] for k in ("task", "epoch", "cohort", "members", "index", "path")
        )
        if not (isinstance(task, str) and isinstance(cohort, str) and _count(epoch) and _count(index)):
            raise DirectoryError("a cohort page's task and cohort are strings, its epoch and index counts")
        if not isinstance(members, list) or len(members) > MAX_PAGE_MEMBERS:
            raise DirectoryError(f"a cohort page lists at most {MAX_PAGE_MEMBERS} members")
        if not all(
            isinstance(m, list) and len(m) == 2 and all(isinstance(x, str) for x in m) for m in members
        ):
            raise DirectoryError("a cohort page's member is [peer id, key]")
        if not isinstance(path, list) or len(path) > MAX_PATH or not all(_hash_hex(h) for h in path):
            raise DirectoryError(f"a cohort page's path is at most {MAX_PATH} hex SHA-256 hashes")
        listed = tuple(DirectoryMember(p, k) for p, k in members)
        return cls(task, epoch, cohort, listed, index, tuple(bytes.fromhex(h) for h in path))


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _hash_hex(value: object) -> bool:
    if not isinstance(value, str) or len(value) != 64:
        return False
    try:
        bytes.fromhex(value)
    except ValueError:
        return False
    return True


class CohortDirectory:
    """An aggregator's whole directory of one epoch: its header's fields and its pages."""

    def __init__(
        self, task_id: str, epoch: int, first_attempt: int, cohorts: Mapping[str, Iterable[DirectoryMember]]
    ):
        """ValueError if a peer is in two cohorts, or a cohort has no member."""
        self.task_id, self.epoch, self.first_attempt = task_id, epoch, first_attempt
        self.cohorts: dict[str, tuple[DirectoryMember, ...]] = {
            name: tuple(sorted(set(cohorts[name]))) for name in sorted(cohorts)
        }
        peers = [m.peer_id for members in self.cohorts.values() for m in members]
        if len(set(peers)) != len(peers):
            raise ValueError("a peer is in one cohort of a directory")
        if any(not members for members in self.cohorts.values()):
            raise ValueError("a cohort of a directory has a member")
        self.names = list(self.cohorts)  # the tree's leaf order
        self._position = {name: i for i, name in enumerate(self.names)}
        self._cohort_of = {m.peer_id: name for name, members in self.cohorts.items() for m in members}
        self.size = len(peers)
        self._pages = [
            CohortPage(task_id, epoch, name, self.cohorts[name], i, ()) for i, name in enumerate(self.names)
        ]
        self._subtree = memoized_subtree_hash([leaf_hash(p.leaf()) for p in self._pages])
        self.root = self._subtree(0, len(self._pages)) if self._pages else EMPTY_ROOT

    def cohort_of(self, peer_id: str) -> str | None:
        return self._cohort_of.get(peer_id)

    def header(self, timestamp: int) -> DirectoryHeader:
        return DirectoryHeader(
            task_id=self.task_id, epoch=self.epoch, first_attempt=self.first_attempt, size=self.size,
            cohorts=len(self.names), root=self.root.hex(), timestamp=timestamp,
        )  # fmt: skip

    def page(self, cohort: str) -> CohortPage:
        """The page of ``cohort``, with its path; KeyError if the directory has no such cohort."""
        i = self._position[cohort]
        bare = self._pages[i]
        path = tuple(inclusion_path(i, len(self._pages), self._subtree))
        return CohortPage(bare.task_id, bare.epoch, bare.cohort, bare.members, i, path)


@dataclass(frozen=True)
class PageRequest:
    """What a page request asks a directory's server for: ``epoch``'s page of ``cohort``, the page
    that lists ``peer_id`` (a peer does not know which part of a split cohort it is in), or the
    page at leaf ``index`` (whoever reads the whole directory knows only the header's count)."""

    epoch: int
    cohort: str | None = None
    peer_id: str | None = None
    index: int | None = None


def page_request(
    epoch: int, cohort: str | None = None, peer_id: str | None = None, index: int | None = None
) -> bytes:
    """The bytes of a :class:`PageRequest` (exactly one of ``cohort``, ``peer_id``, ``index``)."""
    if (cohort is not None) + (peer_id is not None) + (index is not None) != 1:
        raise ValueError("a page request names a cohort, a peer or an index")
    asked = cohort if cohort is not None else f"@{peer_id}" if peer_id is not None else f"#{int(index)}"
    return f"{epoch} {asked}".encode()


def parse_page_request(payload: bytes) -> PageRequest:
    """The request ``payload`` makes; DirectoryError if malformed."""
    epoch, _, asked = bytes(payload).decode(errors="replace").partition(" ")
    if not (epoch.isascii() and epoch.isdigit()) or len(epoch) > 18 or not asked or len(asked) > 160:
        raise DirectoryError(
            "a page request is '<epoch> <cohort>', '<epoch> @<peer id>' or '<epoch> #<index>'"
        )
    if asked.startswith("@"):
        return PageRequest(int(epoch), peer_id=asked[1:])
    if asked.startswith("#"):
        if not (asked[1:].isascii() and asked[1:].isdigit()) or len(asked) > 19:
            raise DirectoryError("a page's index is a count")
        return PageRequest(int(epoch), index=int(asked[1:]))
    return PageRequest(int(epoch), cohort=asked)


# What asks a directory's server for the sealed headers of the epochs it still serves: the DHT
# holds one aggregator's newest only, which may govern a later attempt than the one being planned.
HEADERS_REQUEST = b"headers"
MAX_HEADERS = 16  # headers one reply may carry


def headers_reply(wires: Sequence[bytes]) -> bytes:
    """The reply to :data:`HEADERS_REQUEST`: each sealed header's wire bytes."""
    return json.dumps({"headers": [bytes(w).hex() for w in wires]}).encode()


def parse_headers_reply(data: bytes) -> list[bytes]:
    """The sealed headers' wire bytes a :func:`headers_reply` carries (each to be opened and checked
    by the caller); DirectoryError if malformed."""
    try:
        value = json.loads(data)
        wires = value["headers"]
        if not isinstance(wires, list) or len(wires) > MAX_HEADERS:
            raise ValueError("not a list of at most MAX_HEADERS")
        return [bytes.fromhex(w) for w in wires]
    except (ValueError, TypeError, KeyError) as e:
        raise DirectoryError(f"not a headers reply: {type(e).__name__}") from None


def governing(headers: Sequence[DirectoryHeader], attempt: int) -> DirectoryHeader | None:
    """The header that governs ``attempt``: the greatest ``first_attempt`` at most ``attempt`` (the
    newer epoch of two with the same one), or None if none starts by then."""
    starting = [h for h in headers if h.first_attempt <= attempt]
    return max(starting, key=lambda h: (h.first_attempt, h.epoch), default=None)
