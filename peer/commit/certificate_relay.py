"""How one attempt's commit certificates reach every peer: votes among a cohort's members, each
cohort's votes up a tree of cohort leaders, all of them back down, and gossip where a leader is gone.

1. A peer holding a result signs its vote and sends it to each of its cohort's members (2 to 8 peers
   that know each other from the roster), so every member holds the cohort's votes.
2. The cohort's *sender* (its first member, in peer id order, whose vote is held) sends them up the
   tree of :mod:`peer.averaging.cross_tree`: a tree group is led by the first two members of the
   lowest-ranked cohort under it (each unit sends to both: one may be gone or behind), and each
   leader passes up what its units sent once every unit sent, or once its level's wait is over. Votes that come later follow as they come (each hop sends only votes it
   has not sent), ``update_wait`` apart: members finish their averaging seconds apart.
3. The root sends everything down the same way, and what comes later as it comes; a peer commits
   once the votes it checked for one result are more than half of the roster less the departures
   seen (:class:`protocol.commit_certificate.CertificateTally`).
4. A peer not decided ``gossip_after`` seconds after its vote asks ``gossip_peers`` random roster
   peers every ``gossip_every`` seconds, ``gossip_times`` times, then at doubling spacings (at most
   ``gossip_most_every``) until ``gossip_for`` seconds after its vote or the end of its wait (a
   peer whose view of the tree is not the others' hears the votes that came after its first asks;
   an attempt that never decides costs a few asks more), and each answers with every certificate
   it holds.

Sans-IO: the relay sends nothing and reads no clock. :meth:`CertificateRelay.vote`,
:meth:`~CertificateRelay.receive` and :meth:`~CertificateRelay.tick` take the time and return the
messages to send; the caller's transport carries them (direct streams, or a simulation's queue).
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass, field

from peer.averaging.cross_tree import DEFAULT_FANOUT, TreeGroup, cross_groups, units_of
from protocol.commit_certificate import (
    ABORTED,
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
    PROBE = "probe"  # are you there: the call's reply answers it; no relay state changes


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
    update_wait: float = 0.2  # seconds a hop gathers votes that came late before passing them on
    gossip_after: float = 6.0  # seconds after its vote that a peer not committed starts asking around
    gossip_every: float = 1.0
    gossip_peers: int = 2
    gossip_times: int = 8  # asks gossip_every apart; then the spacing doubles each time
    gossip_most_every: float = 8.0  # the spacing doubles up to this
    gossip_for: float = 90.0  # seconds after its vote that a peer not decided asks (keep_asking: longer)
    leaders: int = 2  # peers that lead each tree group (its lowest cohort's first members): one may be gone


@dataclass(frozen=True)
class RelayPlan:
    """The cohorts in rank order (members in peer id order) and the tree over them: the same on
    every peer that holds the same roster."""

    cohorts: tuple[tuple[str, ...], ...]
    names: tuple[str, ...]
    fanout: int
    _ranks: dict[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        ranks = {peer: rank for rank, members in enumerate(self.cohorts) for peer in members}
        object.__setattr__(self, "_ranks", ranks)

    @classmethod
    def of(cls, roster: RosterSnapshot, fanout: int = DEFAULT_FANOUT) -> RelayPlan:
        names = tuple(sorted(set(roster.cohorts.values())))
        return cls(tuple(tuple(sorted(roster.members_of(n))) for n in names), names, fanout)

    def rank_of(self, peer: str) -> int | None:
        """The rank of ``peer``'s cohort; None for a peer outside the roster."""
        return self._ranks.get(peer)

    def path(self, rank: int) -> list[TreeGroup]:
        """The tree groups above cohort ``rank``, bottom up."""
        return cross_groups(rank, len(self.cohorts), self.fanout)

    def ranks_under(self, group: TreeGroup) -> list[int]:
        """The cohort ranks under ``group``, lowest first (its lowest cohort's first members lead it)."""
        return sorted(rank for unit in units_of(group, len(self.cohorts), self.fanout) for rank in unit)

    def leaders_of(self, group: TreeGroup, leaders: int) -> tuple[str, ...]:
        """The peers that lead ``group``: the first ``leaders`` members of the lowest cohort under it."""
        return self.cohorts[self.ranks_under(group)[0]][:leaders]


class CertificateRelay:
    """One peer's part in spreading one attempt's certificates. Complete once constructed; one
    owner calls it (not thread-safe). ``committed`` is the result once its votes are a majority;
    ``decided`` that result, or ``ABORTED`` once none can commit any more."""

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
        rank = self.plan.rank_of(me)
        if rank is None:
            raise ValueError(f"{me} is not in the roster it relays for")
        self.rank = rank
        self.cohort = self.plan.cohorts[self.rank]
        self.scope = self.plan.names[self.rank]
        self.committed: str | None = None
        self.committed_at: float | None = None
        self.decided: str | None = None
        self.refused = 0  # certificates received that did not check out
        self._path = self.plan.path(self.rank)
        # Levels this peer leads if it is one of its cohort's first members: each tree level whose
        # group's lowest cohort is its own. What it passes up is the votes of the cohorts under the top one.
        self._lead_levels = 0
        for group in self._path:
            if self.plan.ranks_under(group)[0] != self.rank:
                break
            self._lead_levels = group.level
        top = self._top_lead()
        if top == 0:
            self._subtree = frozenset({self.scope})
        else:
            self._subtree = frozenset(self.plan.names[r] for r in self.plan.ranks_under(self._path[top - 1]))
        self._started_at: float | None = None  # its vote or first message: a leader's waits count from it
        self._units_in: dict[int, set[int]] = {}  # level -> cohort ranks of the units that sent ups
        # (level, cohort rank[, leader]) -> the peer that last sent an up from there: it gets what comes down
        self._children: dict[tuple, str] = {}
        self._sent_up: dict[tuple, frozenset[str]] = {}  # certificate key -> voters passed up
        self._sent_down: dict[tuple, frozenset[str]] = {}  # certificate key -> voters passed down
        self._to_send_down: dict[tuple, frozenset[str]] = {}  # what came down (or the root released)
        self._served: set[str] = set()  # down-targets that were sent everything in _sent_down
        self._flushed_up = False
        self._late_since: float | None = None  # when the oldest vote not yet passed on came
        self._next_gossip: float | None = None
        self._gossip_until = 0.0
        self.gossip_asked = 0  # asks sent so far
        self.answers = 0  # answers to asks received (pushes)
        self._others = sorted(set(roster.keys) - {me})

    # -- what the caller drives --------------------------------------------------------------

    def vote(self, now: float, certificate: CommitCertificate) -> list[Outgoing]:
        """This peer's own vote (a one-vote certificate of its cohort), sent to its cohort's members."""
        self._started_at = now if self._started_at is None else self._started_at
        self._next_gossip = now + self.settings.gossip_after
        self._gossip_until = now + self.settings.gossip_for
        self._take([certificate.to_wire()], now)
        message = RelayMessage(Kind.VOTE, (certificate.to_wire(),))
        return [Outgoing(m, message) for m in self.cohort if m != self.me] + self.tick(now)

    def receive(self, now: float, sender: str, message: RelayMessage) -> list[Outgoing]:
        """What ``sender`` sent; returns what to send in turn."""
        if message.kind is Kind.PROBE:
            return []
        self._started_at = now if self._started_at is None else self._started_at
        taken = self._take(message.certificates, now)
        rank = self.plan.rank_of(sender)
        if message.kind is Kind.UP and rank is not None:  # a stranger's certificates count, not its place
            self._units_in.setdefault(message.level, set()).add(rank)
            # a cohort's latest sender replaces the earlier one; a unit's leaders are both kept
            self._children[(message.level, rank) if message.level == 1 else (message.level, rank, sender)] = (
                sender
            )
        elif message.kind is Kind.DOWN:
            _note_sent(taken, self._to_send_down)
        elif message.kind is Kind.PUSH:
            self.answers += 1
        elif message.kind is Kind.PULL and self.tally.certificates():
            return [
                Outgoing(sender, RelayMessage(Kind.PUSH, self._wire(self.tally.certificates())))
            ] + self.tick(now)
        return self.tick(now)

    def tick(self, now: float) -> list[Outgoing]:
        """Whatever is due at ``now``: votes up or down the tree, gossip."""
        if self._started_at is None:
            return []
        out: list[Outgoing] = []
        if self._passes_up() and self._up_due(now):
            out += self._flush_up()
        # only the peer that passes its cohort's (or subtree's) votes up passes votes down to it
        if self._to_send_down and self._sent_up and self._passes_up():
            out += self._flush_down()
        if self.decided is None and self._next_gossip is not None and now >= self._next_gossip:
            self.gossip_asked += 1
            doublings = max(0, self.gossip_asked - self.settings.gossip_times + 1)
            after = now + min(self.settings.gossip_most_every, self.settings.gossip_every * 2**doublings)
            self._next_gossip = after if after <= self._gossip_until else None
            for peer in self.rng.sample(self._others, min(self.settings.gossip_peers, len(self._others))):
                out.append(Outgoing(peer, RelayMessage(Kind.PULL)))
        return out

    def next_due(self) -> float | None:
        """When :meth:`tick` has something to do next (None: only a message can bring anything)."""
        if self._started_at is None:
            return None
        due = []
        if self._passes_up() and self._unsent_up():
            due.append(self._up_deadline())
        if self.decided is None and self._next_gossip is not None:
            due.append(self._next_gossip)
        return min(due) if due else None

    def stop_gossip(self) -> None:
        """Ask nobody any more (a later attempt began here); pulls are still answered."""
        self._next_gossip = None
        self._gossip_until = 0.0

    def keep_asking(self, now: float, until: float) -> None:
        """Go on asking, while undecided, until ``until`` (the end of a wait on this attempt): a
        peer that waits longer than ``gossip_for`` hears the decisions the others made meanwhile."""
        if self.decided is not None or self._started_at is None or until <= self._gossip_until:
            return
        self._gossip_until = until
        if self._next_gossip is None:
            self._next_gossip = now

    # -- the tree ----------------------------------------------------------------------------

    def _is_root(self) -> bool:
        return self._top_lead() == len(self._path)

    def _passes_up(self) -> bool:
        """Whether this peer passes votes on: it leads a tree group (whether or not it voted), or it
        is the first member of its cohort whose vote it holds."""
        if self._top_lead() > 0:
            return True
        held = self._voters_of(self.scope)
        return next((m for m in self.cohort if m in held), None) == self.me

    def _top_lead(self) -> int:
        """The highest level this peer leads (0: only its cohort), if it is one of its cohort's first
        ``leaders`` members."""
        return self._lead_levels if self.me in self.cohort[: self.settings.leaders] else 0

    def _voters_of(self, scope: str) -> set[str]:
        return {p for c in self.tally.certificates() if c.scope == scope for p in c.votes}

    def _up_deadline(self) -> float:
        assert self._started_at is not None
        if not self._flushed_up:
            return self._started_at + self.settings.cohort_wait + self._top_lead() * self.settings.level_wait
        late = self._late_since if self._late_since is not None else self._started_at
        return late + self.settings.update_wait

    def _up_due(self, now: float) -> bool:
        """Whether this peer's unsent subtree votes go now: its wait is over, or all it waits for came."""
        if not self._unsent_up():
            return False
        if now >= self._up_deadline():
            return True
        if self._flushed_up:  # later passes gather for their update wait: one message, not one per vote
            return False
        if self._voters_of(self.scope) != set(self.cohort):
            return False
        return all(
            len(self._units_in.get(group.level, set()) - {self.rank}) >= group.size - 1
            for group in self._path[: self._top_lead()]
        )

    def _unsent_up(self) -> list[CommitCertificate]:
        """The votes of this peer's subtree not passed up yet, as certificates."""
        return _unsent([c for c in self.tally.certificates() if c.scope in self._subtree], self._sent_up)

    def _flush_up(self) -> list[Outgoing]:
        delta = self._unsent_up()
        _note_sent(delta, self._sent_up)
        self._flushed_up, self._late_since = True, None
        if self._is_root():  # the top: what it gathered turns and goes down
            _note_sent(delta, self._to_send_down)
            return []
        group = self._path[self._top_lead()]
        message = RelayMessage(Kind.UP, self._wire(delta), group.level)
        leaders = self.plan.leaders_of(group, self.settings.leaders)
        return [Outgoing(leader, message) for leader in leaders if leader != self.me]

    def _flush_down(self) -> list[Outgoing]:
        """What came down (or the root released) and was not yet sent to every down-target, and
        everything sent so far to targets new since."""
        targets = (set(self._children.values()) | set(self.cohort)) - {self.me}
        out: list[Outgoing] = []
        fresh = targets - self._served
        if fresh:
            sent_so_far = [c for c in self.tally.certificates() if c.key in self._sent_down]
            everything = [_restricted(c, self._sent_down[c.key]) for c in sent_so_far]
            if everything:
                message = RelayMessage(Kind.DOWN, self._wire(everything))
                out += [Outgoing(peer, message) for peer in sorted(fresh)]
            self._served |= fresh
        releasable = [
            _restricted(c, self._to_send_down[c.key])
            for c in self.tally.certificates()
            if c.key in self._to_send_down
        ]
        delta = _unsent(releasable, self._sent_down)
        if delta:
            _note_sent(delta, self._sent_down)
            message = RelayMessage(Kind.DOWN, self._wire(delta))
            out += [Outgoing(peer, message) for peer in sorted(self._served & targets)]
        return out

    # -- certificates ------------------------------------------------------------------------

    @staticmethod
    def _wire(certificates: list[CommitCertificate]) -> tuple[bytes, ...]:
        return tuple(c.to_wire() for c in certificates)

    def _take(self, wires: tuple[bytes, ...] | list[bytes], now: float) -> list[CommitCertificate]:
        """The certificates among ``wires`` that check out, taken into the tally."""
        taken = []
        for wire in wires:
            try:
                certificate = CommitCertificate.from_wire(wire)
                fresh = self.tally.add(certificate)
            except CertificateError:
                self.refused += 1
                continue
            taken.append(certificate)
            if fresh and self._flushed_up and self._late_since is None:
                self._late_since = now
        if self.decided is None and taken:
            self.decided = self.tally.decided()
            if self.decided is not None and self.decided != ABORTED:
                self.committed, self.committed_at = self.decided, now
        return taken


def _restricted(certificate: CommitCertificate, voters: frozenset[str]) -> CommitCertificate:
    votes = {p: s for p, s in certificate.votes.items() if p in voters}
    return CommitCertificate(*certificate.key, votes=votes)


def _unsent(
    certificates: list[CommitCertificate], sent: dict[tuple, frozenset[str]]
) -> list[CommitCertificate]:
    """The votes of ``certificates`` not in ``sent`` (key -> voters), as certificates."""
    out = []
    for certificate in certificates:
        done = sent.get(certificate.key, frozenset())
        if set(certificate.votes) - done:
            out.append(_restricted(certificate, frozenset(certificate.votes) - done))
    return out


def _note_sent(certificates: list[CommitCertificate], sent: dict[tuple, frozenset[str]]) -> None:
    for certificate in certificates:
        sent[certificate.key] = sent.get(certificate.key, frozenset()) | frozenset(certificate.votes)
