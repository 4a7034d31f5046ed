"""How one attempt's commit certificates reach every peer: votes among a cohort's members, each
cohort's certificate up a tree of cohort leaders, all of them back down, and gossip where a leader
is gone.

1. A peer holding a result signs its vote and sends it to each of its cohort's members (2 to 8 peers
   that know each other from the roster), so every member can make the cohort's certificate.
2. The cohort's *sender* (its first member, in peer id order, whose vote is held) sends the
   certificate up the tree of :mod:`peer.averaging.cross_tree`: the leader of a tree group is the
   first member of the lowest-ranked cohort under it; it merges what its units send and passes it
   up once every unit sent, or once its level's wait is over.
3. The root sends everything down the same way; a peer commits once the certificates it checked
   cover a majority of the roster (:class:`protocol.commit_certificate.CertificateTally`).
4. A peer not committed ``gossip_after`` seconds after its vote asks ``gossip_peers`` random roster
   peers every ``gossip_every`` seconds, and each answers with every certificate it holds.

Sans-IO: the relay sends nothing and reads no clock. :meth:`CertificateRelay.vote`,
:meth:`~CertificateRelay.receive` and :meth:`~CertificateRelay.tick` take the time and return the
messages to send; the caller's transport carries them (direct streams, or a simulation's queue).
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass

from peer.averaging.cross_tree import DEFAULT_FANOUT, cross_groups
from protocol.commit_certificate import (
    CertificateError,
    CertificateTally,
    CommitCertificate,
    RosterSnapshot,
)

HEADER_BYTES = 16  # what a message costs on a stream beside its certificates (kind, framing)


class Kind(enum.Enum):
    VOTE = "vote"  # a member's own vote, to its cohort's members
    UP = "up"  # a unit's certificates, to its tree group's leader
    DOWN = "down"  # every certificate the root gathered, back down the tree
    PULL = "pull"  # gossip: send me what you hold
    PUSH = "push"  # gossip: what I hold


@dataclass(frozen=True)
class RelayMessage:
    kind: Kind
    certificates: tuple[bytes, ...] = ()  # each a certificate's wire form
    level: int = 0  # an UP's tree level (1: to a group of cohorts)

    @property
    def size(self) -> int:
        return HEADER_BYTES + sum(len(c) for c in self.certificates)


@dataclass(frozen=True)
class Outgoing:
    to: str
    message: RelayMessage


@dataclass(frozen=True)
class RelaySettings:
    fanout: int = DEFAULT_FANOUT  # units per tree group
    cohort_wait: float = 0.5  # seconds a cohort's sender waits for its members' votes
    level_wait: float = 1.0  # seconds more each tree level's leader waits for its units
    gossip_after: float = 6.0  # seconds after its vote that a peer not committed starts asking around
    gossip_every: float = 1.0
    gossip_peers: int = 2


@dataclass(frozen=True)
class RelayPlan:
    """The cohorts in rank order (members in peer id order) and the tree over them: the same on
    every peer that holds the same roster."""

    cohorts: tuple[tuple[str, ...], ...]
    names: tuple[str, ...]
    fanout: int

    @classmethod
    def of(cls, roster: RosterSnapshot, fanout: int = DEFAULT_FANOUT) -> RelayPlan:
        names = tuple(sorted(set(roster.cohorts.values())))
        return cls(tuple(tuple(sorted(roster.members_of(n))) for n in names), names, fanout)

    def rank_of(self, peer: str) -> int:
        for rank, members in enumerate(self.cohorts):
            if peer in members:
                return rank
        raise KeyError(peer)

    def path(self, rank: int) -> list[tuple[int, int, int]]:
        """(level, group index, units) of each tree group above cohort ``rank``, bottom up."""
        return [(g.level, g.index, g.size) for g in cross_groups(rank, len(self.cohorts), self.fanout)]

    def first_rank_under(self, level: int, index: int) -> int:
        """The lowest cohort rank under group ``index`` of ``level`` (whose first member leads it)."""
        for rank in range(len(self.cohorts)):
            if self.path(rank)[level - 1][1] == index:
                return rank
        raise KeyError((level, index))


class CertificateRelay:
    """One peer's part in spreading one attempt's certificates. Complete once constructed; one
    owner calls it (not thread-safe). ``committed`` is the result once certificates cover a majority."""

    def __init__(
        self,
        me: str,
        task_id: str,
        attempt: int,
        roster: RosterSnapshot,
        settings: RelaySettings,
        rng: random.Random,
        plan: RelayPlan | None = None,
    ):
        self.me, self.settings, self.rng = me, settings, rng
        self.tally = CertificateTally(task_id, attempt, roster)
        self.plan = plan if plan is not None else RelayPlan.of(roster, settings.fanout)
        self.rank = self.plan.rank_of(me)
        self.cohort = self.plan.cohorts[self.rank]
        self.scope = self.plan.names[self.rank]
        self.committed: str | None = None
        self.committed_at: float | None = None
        self.refused = 0  # certificates received that did not check out
        self._path = self.plan.path(self.rank)
        # Levels this peer leads while it is its cohort's first member: 0 (the cohort), then each
        # tree level whose group's lowest cohort is its own.
        self._lead_levels = 0
        for level, index, _ in self._path:
            if self.plan.first_rank_under(level, index) != self.rank:
                break
            self._lead_levels = level
        self._started_at: float | None = None  # its vote or first message: a leader's waits count from it
        self._units_in: dict[int, set[str]] = {}  # level -> senders of ups received
        self._children: set[str] = set()
        self._sent_up = False
        self._sent_down = False
        self._next_gossip: float | None = None
        self._others = sorted(set(roster.keys) - {me})

    # -- what the caller drives --------------------------------------------------------------

    def vote(self, now: float, certificate: CommitCertificate) -> list[Outgoing]:
        """This peer's own vote (a one-vote certificate of its cohort), sent to its cohort's members."""
        self._started_at = now if self._started_at is None else self._started_at
        self._next_gossip = now + self.settings.gossip_after
        self._take([certificate.to_wire()], now)
        message = RelayMessage(Kind.VOTE, (certificate.to_wire(),))
        return [Outgoing(m, message) for m in self.cohort if m != self.me] + self.tick(now)

    def receive(self, now: float, sender: str, message: RelayMessage) -> list[Outgoing]:
        """What ``sender`` sent; returns what to send in turn."""
        self._started_at = now if self._started_at is None else self._started_at
        self._take(message.certificates, now)
        out: list[Outgoing] = []
        if message.kind is Kind.UP:
            self._units_in.setdefault(message.level, set()).add(sender)
            self._children.add(sender)
        elif message.kind is Kind.DOWN and self._sent_up and not self._sent_down:
            out += self._send_down(exclude=sender)
        elif message.kind is Kind.PULL and self.tally.certificates():
            out.append(Outgoing(sender, RelayMessage(Kind.PUSH, self._wire())))
        return out + self.tick(now)

    def tick(self, now: float) -> list[Outgoing]:
        """Whatever is due at ``now``: passing certificates up, the root's sending down, gossip."""
        if self._started_at is None:
            return []
        out: list[Outgoing] = []
        if not self._sent_up and self._passes_up() and self._up_ready(now):
            out += self._send_up()
        if self.committed is None and self._next_gossip is not None and now >= self._next_gossip:
            self._next_gossip = now + self.settings.gossip_every
            for peer in self.rng.sample(self._others, min(self.settings.gossip_peers, len(self._others))):
                out.append(Outgoing(peer, RelayMessage(Kind.PULL)))
        return out

    def next_due(self) -> float | None:
        """When :meth:`tick` has something to do next (None: only a message can bring anything)."""
        if self._started_at is None:
            return None
        due = []
        if not self._sent_up and self._passes_up():
            due.append(
                self._started_at + self.settings.cohort_wait + self._top_lead() * self.settings.level_wait
            )
        if self.committed is None and self._next_gossip is not None:
            due.append(self._next_gossip)
        return min(due) if due else None

    # -- the tree ----------------------------------------------------------------------------

    def _passes_up(self) -> bool:
        """Whether this peer sends certificates on: it leads a tree group (whether or not it voted),
        or it is the first member of its cohort whose vote it holds."""
        if self._top_lead() > 0:
            return True
        held = {p for c in self.tally.certificates() if c.scope == self.scope for p in c.votes}
        return next((m for m in self.cohort if m in held), None) == self.me

    def _top_lead(self) -> int:
        """The highest level this peer leads (0: only its cohort), if it is its cohort's first member."""
        return self._lead_levels if self.cohort[0] == self.me else 0

    def _up_ready(self, now: float) -> bool:
        assert self._started_at is not None
        top = self._top_lead()
        if now >= self._started_at + self.settings.cohort_wait + top * self.settings.level_wait:
            return True
        held = {p for c in self.tally.certificates() if c.scope == self.scope for p in c.votes}
        if held != set(self.cohort):
            return False
        return all(len(self._units_in.get(level, ())) >= units - 1 for level, _, units in self._path[:top])

    def _send_up(self) -> list[Outgoing]:
        self._sent_up = True
        top = self._top_lead()
        if top == len(self._path):  # the root (or the one cohort): everything goes down from here
            return self._send_down(exclude=None)
        level, index, _ = self._path[top]
        leader = self.plan.cohorts[self.plan.first_rank_under(level, index)][0]
        return [Outgoing(leader, RelayMessage(Kind.UP, self._wire(), level))]

    def _send_down(self, exclude: str | None) -> list[Outgoing]:
        self._sent_down = True
        message = RelayMessage(Kind.DOWN, self._wire())
        targets = (self._children | set(self.cohort)) - {self.me, exclude}
        return [Outgoing(peer, message) for peer in sorted(targets)]

    # -- certificates ------------------------------------------------------------------------

    def _wire(self) -> tuple[bytes, ...]:
        return tuple(c.to_wire() for c in self.tally.certificates())

    def _take(self, wires: tuple[bytes, ...] | list[bytes], now: float) -> None:
        for wire in wires:
            try:
                self.tally.add(CommitCertificate.from_wire(wire))
            except CertificateError:
                self.refused += 1
        if self.committed is None:
            self.committed = self.tally.committed()
            if self.committed is not None:
                self.committed_at = now
