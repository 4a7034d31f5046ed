"""A peer's policy toward dishonest partners, over the evidence its all-reduces collect:
:class:`PeerGuard`."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from hivemind_adapter.allreduce import VerifiedAverager
from peer.commit.waits import CommitDecision
from peer.guard.admission import AdmissionMemory
from peer.guard.conviction_watch import ConvictionWatch
from protocol.proof_attestation import Equivocation
from protocol.records import MAX_PROOFS_POSTED

logger = logging.getLogger(__name__)

# How long a reducer whose replies this peer refused stays out of its groups: the rounds go on
# without it, and a peer refused by mistake comes back.
BAR_SECONDS = 600.0
# A cross-stage reducer refused only for its own part's place may be an honest head carrying its
# cohort's bent result: barred this long, doubled each time, up to BAR_SECONDS (docs/security.md).
FIRST_OWN_PART_BAR_SECONDS = 60.0


@dataclass
class AttemptEvidence:
    """What this peer's all-reduces showed in one attempt, for its commit report."""

    named: set[str] = field(default_factory=set)  # peers its reducers named outliers
    attested: dict[str, None] = field(default_factory=dict)  # proof attestation tokens, in order
    checked: list[str] = field(default_factory=list)  # tokens of the groups of three it checked
    check_seconds: float = 0.0  # spent waiting for partners' checks

    def outliers(self) -> tuple[str, ...]:
        return tuple(sorted(self.named))

    def proofs(self) -> tuple[str, ...]:
        return tuple(self.attested)[:MAX_PROOFS_POSTED]


class PeerGuard:
    """Names, bars, excuses and convicts the reducers of one averager's all-reduces, and tells their
    matchmaking whom to admit.

    ``peer_id``: this peer's; ``averagers``: the hivemind averagers whose evidence it collects, the
    cross-cohort one last (a refusal there for a reducer's own part may be an honest head's,
    :data:`FIRST_OWN_PART_BAR_SECONDS`);
    ``admitted`` reads the roster's peers and keys (None: a swarm without MANTA keys, whose peers
    trust each other); ``convictions``: evidence found late or posted by others (None: none kept).
    """

    def __init__(
        self,
        peer_id: str,
        averagers: Sequence[VerifiedAverager],
        admitted: Callable[[], Mapping[str, str]] | None = None,
        convictions: ConvictionWatch | None = None,
    ):
        self.peer_id, self.averagers = peer_id, tuple(averagers)
        self.admitted, self.convictions = admitted, convictions
        self.admission = AdmissionMemory()
        self.attempt: int | None = None  # the attempt under way (or last ended)
        self.evidence = AttemptEvidence()
        self._refused_in: dict[str, int | None] = {}  # reducer -> the attempt its averages were refused in
        self._convicted_seen = 0  # how many convicted keys admit() has barred so far

    def begin_attempt(self, attempt: int) -> None:
        """A new attempt: what the all-reduces showed since the last one ended is not its evidence."""
        self.attempt = attempt
        self.take_named()
        self.evidence = AttemptEvidence()
        self.admit()

    def admit(self) -> None:
        """Tell the averagers' matchmaking which peers it may meet now: the recent roster, less the
        barred peers and convicted keys."""
        if self.admitted is None:
            return
        if self.convictions is not None:
            convicted = self.convictions.convicted_keys()
            for key in convicted:
                self.admission.bar_key(key)
            if len(convicted) > self._convicted_seen:  # a lie just came to light: see excuse()
                self._convicted_seen = len(convicted)
                self.excuse(self.attempt, "a reducer of the swarm was convicted of equivocation")
        self.refresh_admission()

    def refresh_admission(self) -> None:
        """Admit the peers the roster shows now besides those admitted before (a stage looking for its
        group calls this: a peer its roster missed at the attempt's start would be refused, and
        refusing a group that already began breaks it for every member)."""
        if self.admitted is None:
            return
        try:
            read = dict(self.admitted())
        except Exception as e:  # a failed read admits no one new and bars no one
            logger.debug(f"could not read the roster to admit peers: {e}")
            return
        peers = self.admission.update(read, self.peer_id)
        if peers is not None:
            for averager in self.averagers:
                averager.set_admitted(peers)

    def take_named(self) -> None:
        """Collect whom the all-reduces named and the attestations they accepted, and catch every
        reducer whose replies were refused (the stage failed for it, and it is barred so that the
        stage does not form again around it)."""
        cross = self.averagers[-1] if len(self.averagers) > 1 else None
        for averager in self.averagers:
            self.evidence.named.update(averager.take_named())
            self.evidence.attested.update((a.to_token(), None) for a in averager.take_attestations())
            for refused in averager.take_refused():
                if refused.for_its_own_part and averager is cross:
                    self.caught(
                        refused.peer, "its own part lay far beyond the others'", for_its_own_part=True
                    )
                else:
                    self.caught(refused.peer, "this peer refused its averages as implausible")
                self._refused_in[refused.peer] = self.attempt

    def refused_in(self, attempt: int) -> tuple[str, ...]:
        """The reducers whose averages this peer refused in ``attempt``."""
        return tuple(sorted(p for p, at in self._refused_in.items() if at == attempt))

    def public_keys(self) -> dict[str, str] | None:
        """The roster's keys (peer id -> hex) whose signatures count here; None in a swarm without
        MANTA keys."""
        return None if self.admitted is None else self.admission.keys()

    def barred_for(self) -> dict[str, float]:
        """The peers barred from this peer's groups, with the seconds left (a convicted key's: inf)."""
        return self.admission.barred_for()

    def barred(self) -> set[str]:
        return self.admission.barred()

    def caught(self, peer: str, why: str, *, for_its_own_part: bool = False) -> None:
        """``peer`` sent this peer results it cannot have computed honestly: name it in this attempt's
        report and bar it for :data:`BAR_SECONDS` (``for_its_own_part``: for
        :data:`FIRST_OWN_PART_BAR_SECONDS`, doubled each time again)."""
        self.evidence.named.add(peer)
        already = peer in self.admission.barred()
        if for_its_own_part:
            seconds = self.admission.bar_again(peer, FIRST_OWN_PART_BAR_SECONDS, BAR_SECONDS)
        else:
            seconds = BAR_SECONDS
            self.admission.bar(peer, seconds)
        if not already:
            logger.warning(f"{peer[-8:]} barred for {seconds:.0f} s: {why}")

    def excuse(self, attempt: int | None, why: str, liar: str | None = None) -> None:
        """Lift the bars placed in ``attempt`` (or the one before) on reducers whose averages this peer
        refused, but ``liar``'s: a reducer convicted of equivocation then explains them, and an honest
        head that carried the lie would otherwise stay barred. A real liar is refused again."""
        if attempt is None:
            return
        recent = [
            p
            for p, at in self._refused_in.items()
            if p != liar and at is not None and attempt - 1 <= at <= attempt
        ]
        for peer in recent:
            del self._refused_in[peer]
            self.admission.unbar(peer)
            logger.warning(
                f"{peer[-8:]} no longer barred: {why}, which its refused averages may have carried"
            )

    def convict(self, attempt: int, equivocation: Equivocation) -> None:
        """A reducer of ``attempt`` signed two different proofs for one all-reduce: bar it here, and
        post the evidence so that every other peer bars it too."""
        liar = equivocation.reducer
        self.caught(liar, equivocation.describe())
        self.excuse(attempt, f"reducer {liar[-8:]} told members different stories", liar)
        if self.convictions is not None:
            self.convictions.report(equivocation)

    def after_decision(self, attempt: int, decision: CommitDecision, witnesses: Sequence[str], board) -> None:
        """A commit wait ended: convict a reducer it showed equivocating, or have the attempt read again
        later if a contributor had not reported yet (a reducer may have held its results back)."""
        if decision.equivocation is not None:
            self.convict(attempt, decision.equivocation)
        elif self.convictions is not None and set(witnesses) - decision.seen:
            self.convictions.recheck_later(board, attempt)
