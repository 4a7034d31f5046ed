"""The values a round's averaging hands on: who contributed (:class:`Contributor`), what one attempt
produced (:class:`AveragingOutcome`), and the per-attempt bookkeeping of the stages (:class:`Attempt`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import torch

from peer.averaging.cross_tree import TreeGroup
from peer.averaging.stage import RoundAborted
from peer.commit.report import CommitReport
from robust_aggregation.reducer_proof import NoiseMap


@dataclass(frozen=True)
class Contributor:
    """One peer whose host contribution is in a round's average, as the round's stages gather it."""

    peer: str
    cohort: str
    samples: int
    state: str  # digest of the state its gradient was computed from
    client: bool  # a client-mode peer: it cannot serve, so it never leads its cohort

    def to_wire(self) -> dict:
        """What travels in hivemind's gathered metadata (msgpack: plain types only)."""
        return {"peer": self.peer, "cohort": self.cohort, "samples": self.samples, "state": self.state,
                "client": self.client}  # fmt: skip

    @classmethod
    def from_wire(cls, value: dict) -> Contributor:
        """Raises :class:`RoundAborted` for a malformed record."""
        try:
            return cls(str(value["peer"]), str(value["cohort"]), int(value["samples"]), str(value["state"]),
                       bool(value.get("client", False)))  # fmt: skip
        except (KeyError, TypeError, ValueError) as e:
            raise RoundAborted(f"a malformed contributor record: {e}") from None


def leader_of(members: Sequence[Contributor], servers_only: bool = False) -> str | None:
    """The member that leads a cohort: the first that can serve others (client-mode peers cannot reduce
    or lead), or with none of those the first of all unless ``servers_only`` (None: no member)."""
    servers = [m.peer for m in members if not m.client]
    if servers or servers_only:
        return servers[0] if servers else None
    return members[0].peer if members else None


def check_contributors(contributors: Sequence[Contributor], state_digest: str) -> None:
    """Raises :class:`RoundAborted` unless every contributor started from one state, ``state_digest``
    (if given)."""
    states = {c.state for c in contributors}
    if len(states) > 1:
        raise RoundAborted(f"contributors started from {len(states)} different states")
    if state_digest and states != {state_digest}:
        raise RoundAborted("contributors started from another state than this peer")


@dataclass
class AveragingOutcome:
    """What one round of averaging produced, as seen by this peer."""

    committed: bool
    reason: str = ""
    tensors: list[torch.Tensor] | None = None  # the average; None when the round was aborted
    contributors: list[Contributor] = field(default_factory=list)  # sorted by peer id
    cohort_members: list[str] = field(default_factory=list)
    leader: str = ""
    digest: str = ""
    group: str = ""  # the averaging group id of the result (protocol.averaging_group), once it has one
    seconds: dict[str, float] = field(default_factory=dict)  # wall time per stage
    regrouped: list[str] = field(default_factory=list)  # stages whose all-reduce broke and formed again
    known_group: bool = False  # the cohort met as a group known from the roster, without matchmaking
    outliers: list[str] = field(default_factory=list)  # peers this peer's reducers named (robust averaging)
    proofs: list[str] = field(default_factory=list)  # proof attestation tokens this peer accepted
    checked: list[str] = field(default_factory=list)  # tokens of the groups of three it checked
    # The result this peer posted but saw no quorum for within its commit wait (None otherwise): it
    # commits late if the others' reports make one after all (:meth:`as_committed`).
    pending: list[torch.Tensor] | None = None

    def report(self) -> CommitReport:
        """This peer's commit report of the attempt: its result, or a failure."""
        return CommitReport(
            ok=not self.reason and bool(self.digest), digest=self.digest, group=self.group,
            outliers=tuple(self.outliers), proofs=tuple(self.proofs), checked=tuple(self.checked),
        )  # fmt: skip

    def as_committed(self) -> AveragingOutcome:
        """This outcome, its pending result committed (a quorum held it after this peer gave up)."""
        return replace(self, committed=True, reason="", tensors=self.pending, pending=None)


@dataclass
class Attempt:
    """The stages' bookkeeping of one attempt, made fresh for each: nothing carries over by accident."""

    number: int
    state_digest: str
    tree: list[TreeGroup]  # the cross-cohort groups this peer's cohort's head meets
    cohort_peers: list[tuple[str, ...]]  # the roster's peers of each cohort, by rank (empty: unknown)
    live: set[str] | None  # the peers that posted for the previous attempt (None: unknown)
    roster: frozenset[str] = frozenset()  # the peers a quorum is counted over (empty: unknown)
    broadcasts_taken: int = 0  # broadcast stages this peer took part in
    cohort_noise: NoiseMap | None = None  # the sampling noise this attempt's cohort stage measured

    @property
    def roster_size(self) -> int:
        return len(self.roster)

    @property
    def levels(self) -> int:
        """The cross-cohort tree's depth (what the stages' deadlines scale by)."""
        return max(1, len(self.tree))
