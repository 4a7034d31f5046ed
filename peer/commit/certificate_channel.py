"""Commit certificates over direct libp2p calls: the transport of :mod:`.certificate_relay`.

A :class:`CertificateChannel` serves one handler on a peer's :class:`~hivemind_adapter.p2p.Endpoint`
and keeps one relay per open attempt. Every relay call runs on the endpoint's event loop (its one
owner), a ticker wakes each relay when it has something due, and each message goes out as its own
bounded call: a lost message is what gossip repairs. Messages for an attempt this peer has not
opened yet (partners that finished averaging first) wait for it, a bounded number of them.

A message is one line of header (``{"attempt", "kind", "level"}``, canonical JSON) and then one
certificate per line (canonical JSON never holds a raw newline).
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

from hivemind_adapter.p2p import Endpoint
from peer.commit.certificate_relay import CertificateRelay, Kind, Outgoing, RelayMessage, RelaySettings
from protocol.canonical import ascii_canonical_json
from protocol.commit_certificate import (
    ABORTED,
    DEPARTED,
    CertificateError,
    CommitCertificate,
    RosterSnapshot,
    VoteEquivocation,
    vote_holds,
)

MAX_MESSAGE_BYTES = 4 * 1024 * 1024
SEND_TIMEOUT = 5.0  # seconds one call may take before it counts as lost
EARLY_MESSAGES = 256  # messages kept for attempts not opened yet, all attempts together
ATTEMPTS_KEPT = 4  # relays of older attempts still answer gossip
EARLY_ATTEMPTS = 4  # how far ahead of the newest open attempt a message may be and still wait
ATTEMPT_WITNESSES = 2  # distinct roster voters an attempt not open here must be heard from to count
PROBE_TIMEOUT = 3.0  # seconds a probed peer has to answer
PROBE_MOST = 8  # peers one probe asks at most (chosen at random)


@dataclass(frozen=True)
class ProbeAnswers:
    """Which peers a probe asked answered it and which did not (failed or took over PROBE_TIMEOUT)."""

    answered: frozenset[str]
    silent: frozenset[str]


@dataclass(frozen=True)
class VoteHearing:
    """What one peer heard of an attempt's votes: what its undecided waits log."""

    voters: int  # roster peers a valid vote came from
    roster: int
    votes_refused: int  # votes left out: of peers outside the roster, or not checking out
    gossip_asked: int  # asks this peer sent
    answers: int = 0  # answers to its asks that came
    sends_lost: int = 0  # its sends of the attempt that failed or took over SEND_TIMEOUT
    last_loss: str = ""  # why the last of them failed
    # how the heard votes split: (a result's first 8 hex digits, "aborted" or "departed"; how many)
    split: tuple[tuple[str, int], ...] = ()

    def describe(self) -> str:
        lost = f", {self.sends_lost} send(s) lost" + (f" (last: {self.last_loss})" if self.last_loss else "")
        split = " (" + ", ".join(f"{name}: {n}" for name, n in self.split) + ")" if self.split else ""
        return (
            f"{self.voters} of {self.roster} voted as heard here{split}, {self.votes_refused} vote(s) refused, "
            f"{self.gossip_asked} ask(s) sent, {self.answers} answer(s) came"
            + (lost if self.sends_lost else "")
        )


def vote_split(votes: Mapping[str, tuple[str, str]]) -> tuple[tuple[str, int], ...]:
    """How many of ``votes`` (voter -> (digest, group)) went to each result, the most first:
    results by their first 8 hex digits, :data:`ABORTED` and :data:`DEPARTED` by name."""
    names = {ABORTED: "aborted", DEPARTED: "departed"}
    counts = Counter(names.get(digest, digest[:8]) for digest, _group in votes.values())
    return tuple(sorted(counts.items(), key=lambda item: (-item[1], item[0])))


def handler_name(task_id: str) -> str:
    return f"manta.{task_id}.certificates.v1"


def encode(attempt: int, message: RelayMessage) -> bytes:
    header = ascii_canonical_json({"attempt": attempt, "kind": message.kind.value, "level": message.level})
    return b"\n".join([header, *message.certificates])


def decode(data: bytes) -> tuple[int, RelayMessage]:
    """(attempt, message) from ``data``; ValueError with the reason if it is not one."""
    if len(data) > MAX_MESSAGE_BYTES:
        raise ValueError(f"a certificate message of {len(data)} bytes is over the limit")
    header, *certificates = data.split(b"\n")
    try:
        fields = json.loads(header)
        attempt, kind, level = int(fields["attempt"]), Kind(fields["kind"]), int(fields["level"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"not a certificate message header: {exc}") from None
    if attempt < 0 or level < 0:
        raise ValueError("a certificate message's attempt and level are not negative")
    return attempt, RelayMessage(kind, tuple(certificates), level)


class CertificateChannel:
    """One peer's certificate relays, carried over ``endpoint``. Complete once constructed (it
    serves its handler); :meth:`close` stops it, bounded."""

    def __init__(
        self,
        endpoint: Endpoint,
        task_id: str,
        settings: RelaySettings,
        rng: random.Random,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.endpoint, self.task_id, self.settings = endpoint, task_id, settings
        self._rng, self._clock = rng, clock
        self._relays: dict[int, CertificateRelay] = {}
        self._lost: dict[int, tuple[int, str]] = {}  # attempt -> sends that failed, why the last did
        self._voted_at: dict[int, float] = {}
        self._early: list[tuple[int, str, RelayMessage]] = []
        self._committed: dict[int, threading.Event] = {}  # set once the attempt is decided
        self._events_lock = threading.Lock()  # guards _committed (read by the caller's thread)
        self._heard: dict[str, int] = {}  # roster voter -> the latest attempt its valid vote was seen for
        self.sent_bytes = self.sent_messages = self.lost_messages = self.refused_messages = 0
        self._wake: asyncio.Event = self.endpoint.loop.run(self._make_event(), timeout=5)
        self._ticker = asyncio.run_coroutine_threadsafe(self._tick_forever(), endpoint.loop.loop)
        endpoint.serve(handler_name(task_id), self._handle)

    # -- the caller's side (any thread) -------------------------------------------------------

    def open(self, attempt: int, roster: RosterSnapshot) -> None:
        """Start relaying ``attempt`` among ``roster`` (this peer must be in it)."""
        self.endpoint.loop.run(self._open(attempt, roster), timeout=10)

    def vote(self, attempt: int, certificate: CommitCertificate) -> None:
        """Send this peer's vote (a one-vote certificate of its cohort) for an open attempt."""
        self.endpoint.loop.run(self._vote(attempt, certificate), timeout=10)

    def wait_committed(self, attempt: int, timeout: float) -> str | None:
        """The result certificates commit for ``attempt``, waiting up to ``timeout`` s; None if none."""
        self._event(attempt).wait(timeout)
        return self.endpoint.loop.run(self._result(attempt), timeout=5)

    def wait_decided(self, attempt: int, timeout: float) -> str | None:
        """``attempt``'s committed result or :data:`~protocol.commit_certificate.ABORTED`, waiting up
        to ``timeout`` s (0: as it stands); None while undecided."""
        if timeout > 0:
            self._event(attempt).wait(timeout)
        return self.endpoint.loop.run(self._decided(attempt), timeout=5)

    def keep_asking(self, attempt: int, seconds: float) -> None:
        """Gossip for ``attempt``'s decision, while it is undecided, for ``seconds`` more at least
        (:meth:`CertificateRelay.keep_asking`): the caller waits that long."""
        self.endpoint.loop.run(self._keep_asking(attempt, seconds), timeout=5)

    def voters(self, attempt: int) -> frozenset[str] | None:
        """The peers a valid vote of ``attempt`` came from (None: the attempt is not open here)."""
        return self.endpoint.loop.run(self._voters(attempt), timeout=5)

    def votes(self, attempt: int) -> dict[str, tuple[str, str]]:
        """Voter -> (digest, group) of its valid vote of ``attempt`` heard here ({}: none, or not open)."""
        return self.endpoint.loop.run(self._votes(attempt), timeout=5)

    def hearing(self, attempt: int) -> VoteHearing | None:
        """What this peer heard of ``attempt``'s votes (None: not open here)."""
        return self.endpoint.loop.run(self._hearing(attempt), timeout=5)

    def equivocations(self, attempt: int) -> list[VoteEquivocation]:
        """The keys seen voting twice in ``attempt`` ([]: none, or not open here)."""
        return self.endpoint.loop.run(self._equivocations(attempt), timeout=5)

    def probe(self, attempt: int, peers: Collection[str]) -> ProbeAnswers:
        """Ask up to :data:`PROBE_MOST` of ``peers`` (at random) directly whether they are there (a
        message of a few bytes; nothing comes back but the reply); bounded by :data:`PROBE_TIMEOUT`."""
        return self.endpoint.loop.run(self._probe(attempt, sorted(peers)), timeout=PROBE_TIMEOUT + 5)

    def latest_attempt(self) -> int:
        """The latest attempt open here or that valid votes of :data:`ATTEMPT_WITNESSES` distinct
        roster peers were seen for, or later ones (-1: none): one key cannot move a peer's attempt
        counter past the swarm's, which would cut it off from the swarm's attempts."""
        return self.endpoint.loop.run(self._latest(), timeout=5)

    def commit_seconds(self, attempt: int) -> float | None:
        """Seconds from this peer's vote in ``attempt`` to its commit there (None: not both)."""
        return self.endpoint.loop.run(self._commit_seconds(attempt), timeout=5)

    def close(self) -> None:
        self.endpoint.unserve(handler_name(self.task_id))
        self._ticker.cancel()

    # -- on the endpoint's loop ---------------------------------------------------------------

    @staticmethod
    async def _make_event() -> asyncio.Event:
        return asyncio.Event()

    def _event(self, attempt: int) -> threading.Event:
        with self._events_lock:
            return self._committed.setdefault(attempt, threading.Event())

    async def _keep_asking(self, attempt: int, seconds: float) -> None:
        relay = self._relays.get(attempt)
        if relay is not None:
            now = self._clock()
            relay.keep_asking(now, now + seconds)
            self._wake.set()

    async def _commit_seconds(self, attempt: int) -> float | None:
        relay, voted = self._relays.get(attempt), self._voted_at.get(attempt)
        if relay is None or voted is None or relay.committed_at is None:
            return None
        return max(0.0, relay.committed_at - voted)

    async def _result(self, attempt: int) -> str | None:
        relay = self._relays.get(attempt)
        return None if relay is None else relay.committed

    async def _decided(self, attempt: int) -> str | None:
        relay = self._relays.get(attempt)
        return None if relay is None else relay.decided

    async def _voters(self, attempt: int) -> frozenset[str] | None:
        relay = self._relays.get(attempt)
        return None if relay is None else relay.tally.voters()

    async def _votes(self, attempt: int) -> dict[str, tuple[str, str]]:
        relay = self._relays.get(attempt)
        return {} if relay is None else relay.tally.votes()

    async def _hearing(self, attempt: int) -> VoteHearing | None:
        relay = self._relays.get(attempt)
        if relay is None:
            return None
        tally = relay.tally
        lost, why = self._lost.get(attempt, (0, ""))
        return VoteHearing(
            len(tally.voters()),
            len(tally.roster),
            tally.votes_refused,
            relay.gossip_asked,
            relay.answers,
            lost,
            why,
            vote_split(tally.votes()),
        )

    async def _equivocations(self, attempt: int) -> list[VoteEquivocation]:
        relay = self._relays.get(attempt)
        return [] if relay is None else relay.tally.equivocations

    async def _probe(self, attempt: int, peers: list[str]) -> ProbeAnswers:
        asked = self._rng.sample(peers, min(PROBE_MOST, len(peers)))
        payload = encode(attempt, RelayMessage(Kind.PROBE))

        async def answers(peer: str) -> bool:
            self.sent_bytes += len(payload)
            self.sent_messages += 1
            try:
                await asyncio.wait_for(
                    self.endpoint.acall(peer, handler_name(self.task_id), payload), PROBE_TIMEOUT
                )
                return True
            except Exception:  # gone, unreachable or too slow to count on
                self.lost_messages += 1
                return False

        replies = await asyncio.gather(*(answers(p) for p in asked))
        return ProbeAnswers(
            frozenset(p for p, ok in zip(asked, replies) if ok),
            frozenset(p for p, ok in zip(asked, replies) if not ok),
        )

    async def _latest(self) -> int:
        heard = sorted(self._heard.values(), reverse=True)
        witnessed = heard[ATTEMPT_WITNESSES - 1] if len(heard) >= ATTEMPT_WITNESSES else -1
        return max(witnessed, max(self._relays, default=-1))

    async def _open(self, attempt: int, roster: RosterSnapshot) -> None:
        if attempt in self._relays:
            return
        for older in self._relays.values():
            older.stop_gossip()
        me = self.endpoint.peer_id
        self._relays[attempt] = CertificateRelay(
            me, self.task_id, attempt, roster, self.settings, random.Random(self._rng.random())
        )
        for old in [a for a in self._relays if a <= attempt - ATTEMPTS_KEPT]:
            del self._relays[old]
            self._voted_at.pop(old, None)
            with self._events_lock:
                self._committed.pop(old, None)
        waiting = [(s, m) for a, s, m in self._early if a == attempt]
        self._early = [e for e in self._early if e[0] > attempt]
        for sender, message in waiting:
            self._after(attempt, self._relays[attempt].receive(self._clock(), sender, message))

    async def _vote(self, attempt: int, certificate: CommitCertificate) -> None:
        relay, now = self._relays[attempt], self._clock()
        self._voted_at[attempt] = now
        self._after(attempt, relay.vote(now, certificate))

    async def _handle(self, payload: bytes, sender: str) -> bytes:
        try:
            attempt, message = decode(payload)
        except ValueError:
            self.refused_messages += 1
            return b""
        if message.kind is Kind.PROBE:  # the reply itself is the answer
            return b""
        relay = self._relays.get(attempt)
        if relay is not None:
            self._after(attempt, relay.receive(self._clock(), sender, message))
            return b""
        for voter in self._valid_voters(attempt, message):
            self._heard[voter] = attempt
        if (
            attempt > max(self._relays, default=-1)
            and attempt <= max(self._relays, default=attempt) + EARLY_ATTEMPTS
        ):
            if len(self._early) < EARLY_MESSAGES:
                self._early.append((attempt, sender, message))
        return b""

    def _valid_voters(self, attempt: int, message: RelayMessage) -> list[str]:
        """Peers of the newest open roster whose valid votes of ``attempt`` ``message`` carries and
        that were not heard voting in it or later yet: only those move :meth:`latest_attempt` (a
        stranger's number does not). At most :data:`ATTEMPT_WITNESSES` signatures are checked per
        message, so a flood costs its sender as much as this peer."""
        if not self._relays or not message.certificates:
            return []
        keys = self._relays[max(self._relays)].tally.roster.keys
        found: list[str] = []
        checks = 0
        for wire in message.certificates:
            try:
                c = CommitCertificate.from_wire(wire)
            except CertificateError:
                return found
            if (c.task_id, c.attempt) != (self.task_id, attempt):
                return found
            for voter, signature in c.votes.items():
                if voter not in keys or self._heard.get(voter, -1) >= attempt or voter in found:
                    continue
                if checks == ATTEMPT_WITNESSES:
                    return found
                checks += 1
                if vote_holds(keys[voter], c.task_id, attempt, c.digest, c.group, signature):
                    found.append(voter)
        return found

    def _after(self, attempt: int, outgoing: list[Outgoing]) -> None:
        """Send what a relay call returned, note a decision, and let the ticker look again."""
        for out in outgoing:
            asyncio.ensure_future(self._send(attempt, out))
        if self._relays[attempt].decided is not None:
            self._event(attempt).set()
        self._wake.set()

    async def _send(self, attempt: int, out: Outgoing) -> None:
        payload = encode(attempt, out.message)
        self.sent_bytes += len(payload)
        self.sent_messages += 1
        try:
            await asyncio.wait_for(
                self.endpoint.acall(out.to, handler_name(self.task_id), payload), SEND_TIMEOUT
            )
        except Exception as e:  # gone, unreachable or slow: gossip carries what this one did not
            self.lost_messages += 1
            lost = self._lost.get(attempt, (0, ""))[0] + 1
            self._lost[attempt] = (lost, f"{type(e).__name__}: {str(e)[:80]}" if str(e) else type(e).__name__)
            for old in [a for a in self._lost if a < attempt - ATTEMPTS_KEPT]:
                del self._lost[old]

    async def _tick_forever(self) -> None:
        while True:
            now = self._clock()
            dues = []
            for attempt, relay in list(self._relays.items()):
                due = relay.next_due()
                if due is not None and due <= now:
                    self._after(attempt, relay.tick(now))
                    due = relay.next_due()
                if due is not None:
                    dues.append(due)
            self._wake.clear()
            wait = max(0.01, min(dues) - self._clock()) if dues else 1.0
            try:
                await asyncio.wait_for(self._wake.wait(), wait)
            except TimeoutError:
                pass
