"""Commit votes, the certificates that carry a cohort's votes, and the tally that decides a round.

A **vote** is one peer's signed word on how its attempt ended: its MANTA key signs
``(task, attempt, result digest, averaging group)``, the digest being the result's, :data:`ABORTED`
(no result) or :data:`DEPARTED` (the peer left the swarm). A peer votes once per attempt, so two
valid votes of one key for one attempt that differ are evidence against it that anyone can check.

A **certificate** carries votes of one cohort (its *scope*) for one result up and down the
cross-cohort tree. The scope routes it and nothing more: a verifier counts a vote if its roster
holds the voter (each member's signed announcement gives its key) and the signature checks out.

A peer **commits** a result once the valid votes for it it has checked are more than half of the
attempt's roster less the peers it saw depart. Two verifiers that saw departures ``d1``, ``d2`` of
the ``d`` there were and committed results with ``a`` and ``b`` voters have ``a + b > n - d``; but
voters of two results and departed peers are disjoint, ``a + b + d <= n``, unless some key voted
twice, and its two votes are the evidence. A key that equivocated counts for nothing. (Counting whole
cohorts covered by a majority instead is not safe with departures: docs/protocol.md.)

Votes travel in a certificate as ``[peer id, signature hex]`` pairs; the verifier finds each peer's
key in its roster (whose announcements were checked against the peer id's libp2p key).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from pydantic import Field, ValidationError

from protocol.canonical import ascii_canonical_json, canonical_json
from protocol.fields import Int53, Name, PeerId, StrictModel
from protocol.identity import Identity, verify_signature

ABORTED = "0" * 64  # the digest a peer votes for when its attempt ended without a result
DEPARTED = "f" * 64  # the digest a peer votes for when it leaves the swarm during the attempt
DOMAIN = b"manta/commit-vote/v1\n"  # what a vote's signed message starts with (no other record does)
MAX_VOTES = 1024  # votes one certificate may carry: far above a cohort's size
MAX_WIRE_BYTES = 256 * MAX_VOTES
_DIGEST = re.compile(r"^(?:[0-9a-f]{32}|[0-9a-f]{64})$")
_GROUP = re.compile(r"^(?:[0-9a-f]{64})?$")
_SIGNATURE = re.compile(r"^[0-9a-f]{128}$")


class CertificateError(ValueError):
    """A certificate that does not count, and why."""


class MalformedCertificate(CertificateError):
    """The bytes are not a certificate: bad JSON, a field of the wrong form, or too large."""


class WrongAttempt(CertificateError):
    """The certificate is for another task or attempt than the one being decided."""


class UnknownVoter(CertificateError):
    """A vote from a peer the verifier's roster does not hold."""


class BadVote(CertificateError):
    """A vote whose signature does not check out under the voter's key in the roster."""


def vote_message(task_id: str, attempt: int, digest: str, group: str) -> bytes:
    """The exact bytes a vote signs."""
    return DOMAIN + canonical_json([task_id, attempt, digest, group])


def sign_vote(identity: Identity, task_id: str, attempt: int, digest: str, group: str) -> str:
    """The hex signature of ``identity``'s vote for result ``digest`` of averaging group ``group``."""
    return identity.sign(vote_message(task_id, attempt, digest, group)).hex()


def vote_holds(
    public_key_hex: str, task_id: str, attempt: int, digest: str, group: str, signature: str
) -> bool:
    """Whether ``signature`` is the vote of ``public_key_hex`` for that result (never raises)."""
    try:
        key, raw = bytes.fromhex(public_key_hex), bytes.fromhex(signature)
    except ValueError:
        return False
    return verify_signature(key, vote_message(task_id, attempt, digest, group), raw)


class _WireCertificate(StrictModel):
    task: Name
    attempt: Int53
    scope: Name
    digest: str
    group: str
    votes: tuple[tuple[PeerId, str], ...] = Field(max_length=MAX_VOTES)


@dataclass(frozen=True)
class CommitCertificate:
    """The votes of cohort ``scope``'s members for result ``digest`` (of averaging group ``group``)
    in ``attempt``: ``votes`` maps peer id to signature hex. Not checked until :func:`check_certificate`."""

    task_id: str
    attempt: int
    scope: str
    digest: str
    group: str
    votes: Mapping[str, str] = field(default_factory=dict)

    def merged(self, other: CommitCertificate) -> CommitCertificate:
        """This certificate with ``other``'s votes added (the same task, attempt, scope and result)."""
        if self.key != other.key:
            raise ValueError("only certificates of one scope and result merge")
        return CommitCertificate(*self.key, votes={**other.votes, **self.votes})

    @property
    def key(self) -> tuple[str, int, str, str, str]:
        return self.task_id, self.attempt, self.scope, self.digest, self.group

    def to_wire(self) -> bytes:
        """Canonical JSON, votes in peer id order."""
        return ascii_canonical_json(
            {
                "task": self.task_id,
                "attempt": self.attempt,
                "scope": self.scope,
                "digest": self.digest,
                "group": self.group,
                "votes": [[peer, self.votes[peer]] for peer in sorted(self.votes)],
            }
        )

    @classmethod
    def from_wire(cls, data: bytes) -> CommitCertificate:
        """The certificate in ``data``; :class:`MalformedCertificate` says what is wrong with it."""
        if len(data) > MAX_WIRE_BYTES:
            raise MalformedCertificate(f"{len(data)} bytes is over the {MAX_WIRE_BYTES}-byte limit")
        try:
            wire = _WireCertificate.model_validate_json(data)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(part) for part in first["loc"]) or "certificate"
            raise MalformedCertificate(f"{where}: {first['msg']}") from None
        if not _DIGEST.match(wire.digest):
            raise MalformedCertificate("digest: not a 32- or 64-digit lowercase hex digest")
        if not _GROUP.match(wire.group):
            raise MalformedCertificate("group: not a 64-digit lowercase hex id")
        votes: dict[str, str] = {}
        for peer, signature in wire.votes:
            if not _SIGNATURE.match(signature):
                raise MalformedCertificate(f"votes: the signature of {peer} is not 128 hex digits")
            if votes.setdefault(peer, signature) != signature:
                raise MalformedCertificate(f"votes: {peer} appears twice")
        return cls(wire.task, wire.attempt, wire.scope, wire.digest, wire.group, votes)


@dataclass(frozen=True)
class RosterSnapshot:
    """What a verifier needs of its admitted roster: each member's MANTA key (hex) and cohort."""

    keys: Mapping[str, str]
    cohorts: Mapping[str, str]
    _by_cohort: dict[str, frozenset[str]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if set(self.keys) != set(self.cohorts):
            raise ValueError("every roster member needs both a key and a cohort")
        by_cohort: dict[str, set[str]] = {}
        for peer, cohort in self.cohorts.items():
            by_cohort.setdefault(cohort, set()).add(peer)
        object.__setattr__(self, "_by_cohort", {c: frozenset(m) for c, m in by_cohort.items()})

    def members_of(self, scope: str) -> frozenset[str]:
        return self._by_cohort.get(scope, frozenset())

    def __len__(self) -> int:
        return len(self.keys)


@dataclass(frozen=True)
class VoteEquivocation:
    """A key that voted for two different results (or groups) in one attempt; both votes check out."""

    peer_id: str
    first: tuple[str, str, str]  # digest, group, signature
    second: tuple[str, str, str]

    def describe(self) -> str:
        return (
            f"peer {self.peer_id[-8:]} voted for {self.first[0][:8]} and {self.second[0][:8]} in one attempt"
        )


def _check_attempt(certificate: CommitCertificate, task_id: str, attempt: int) -> None:
    if (certificate.task_id, certificate.attempt) != (task_id, attempt):
        raise WrongAttempt(
            f"certificate of {certificate.task_id} attempt {certificate.attempt}, not {task_id} attempt {attempt}"
        )


class CertificateTally:
    """The votes one verifier has checked for one attempt, and the result they commit.

    Certificates of one scope and result merge (their votes add up), each vote checked once. A
    result commits once its voters are more than half of the roster less the peers seen departing
    (:data:`DEPARTED` votes); equivocators count for nothing. Not thread-safe: one owner."""

    def __init__(self, task_id: str, attempt: int, roster: RosterSnapshot):
        self.task_id, self.attempt, self.roster = task_id, attempt, roster
        self.votes_checked = 0  # signatures checked so far (what taking certificates in costs)
        self.votes_refused = 0  # votes left out: of peers outside the roster, or not checking out
        self._certificates: dict[tuple[str, int, str, str, str], CommitCertificate] = {}
        self._votes: dict[str, tuple[str, str, str]] = {}  # voter -> its first valid vote seen
        self._equivocations: dict[str, VoteEquivocation] = {}

    def add(self, certificate: CommitCertificate) -> bool:
        """Take ``certificate``'s valid votes in; True if one of them was not held before. A vote
        from a peer the roster does not hold, or whose signature does not check out, is left out
        (:attr:`votes_refused`): whoever relays a certificate cannot sink its other votes by adding
        one. The certificate's scope only routes it: a vote counts whichever cohort it travels in,
        so verifiers whose rosters rank the cohorts differently still count the same votes. Raises
        :class:`CertificateError` for a certificate of another attempt, or one whose new votes are
        all refused (nothing of it is kept)."""
        _check_attempt(certificate, self.task_id, self.attempt)
        known = self._certificates.get(certificate.key)
        held = {} if known is None else known.votes
        fresh = {peer: sig for peer, sig in certificate.votes.items() if peer not in held}
        valid: dict[str, str] = {}
        refused: CertificateError | None = None
        c = certificate
        for peer, signature in fresh.items():
            if peer not in self.roster.keys:
                refused = refused or UnknownVoter(f"{peer[-8:]} is not in the roster")
            elif not vote_holds(self.roster.keys[peer], c.task_id, c.attempt, c.digest, c.group, signature):
                self.votes_checked += 1
                refused = refused or BadVote(
                    f"the vote of {peer[-8:]} does not check out under its roster key"
                )
            else:
                self.votes_checked += 1
                valid[peer] = signature
                continue
            self.votes_refused += 1
        if not valid:
            if refused is not None:
                raise refused
            return False
        for peer, signature in valid.items():
            vote = (certificate.digest, certificate.group, signature)
            first = self._votes.setdefault(peer, vote)
            if first[:2] != vote[:2] and peer not in self._equivocations:
                self._equivocations[peer] = VoteEquivocation(peer, first, vote)
        kept = CommitCertificate(*certificate.key, votes=valid)
        self._certificates[certificate.key] = kept if known is None else known.merged(kept)
        return True

    @property
    def equivocations(self) -> list[VoteEquivocation]:
        return list(self._equivocations.values())

    def certificates(self) -> list[CommitCertificate]:
        """Every certificate held, merged: what this verifier passes on."""
        return list(self._certificates.values())

    def counted(self, digest: str) -> frozenset[str]:
        """The peers whose vote for ``digest`` counts (under any averaging group): equivocators left out."""
        return frozenset(
            peer
            for peer, (voted, _, _) in self._votes.items()
            if voted == digest and peer not in self._equivocations
        )

    def departed(self) -> frozenset[str]:
        """The peers seen departing the attempt: the roster a majority is taken of leaves them out."""
        return self.counted(DEPARTED)

    def majority_of(self) -> int:
        """How many peers a majority is taken of: the roster less the departures seen."""
        return len(self.roster) - len(self.departed())

    def _result_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for peer, (digest, _, _) in self._votes.items():
            if digest not in (ABORTED, DEPARTED) and peer not in self._equivocations:
                counts[digest] = counts.get(digest, 0) + 1
        return counts

    def committed(self) -> str | None:
        """The result whose voters are more than half of the roster less the departures seen, or None."""
        of = self.majority_of()
        return next((d for d, n in sorted(self._result_counts().items()) if 2 * n > of), None)

    def voters(self) -> frozenset[str]:
        """Every peer a valid vote (any result, :data:`ABORTED` or :data:`DEPARTED`) was seen from."""
        return frozenset(self._votes)

    def votes(self) -> dict[str, tuple[str, str]]:
        """Voter -> (digest, group) of the first valid vote seen from it."""
        return {peer: (digest, group) for peer, (digest, group, _) in self._votes.items()}

    def decided(self) -> str | None:
        """The committed result; :data:`ABORTED` once no result can commit any more, whatever the
        peers not heard from vote; None while it is open. (An unheard peer that departs takes one
        from the majority's base but two from a result's reach: a result's best case is that every
        unheard peer votes for it.)"""
        counts = self._result_counts()
        of = self.majority_of()
        committed = next((d for d, n in sorted(counts.items()) if 2 * n > of), None)
        if committed is not None:
            return committed
        unheard = len(self.roster.keys.keys() - self._votes.keys())
        return None if 2 * (max(counts.values(), default=0) + unheard) > of else ABORTED
