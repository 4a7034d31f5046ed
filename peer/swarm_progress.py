"""How far the swarm is in the current round, and when this peer should stop computing.

Like hivemind's ``ProgressTracker``: every peer publishes its own progress (samples so far, its
throughput) every :data:`PUBLISH_EVERY` seconds under the task's signed progress key, reads everyone
else's, and from both *projects* the swarm's total. A round's computation closes when the projected
total reaches the round's sample target. Projected, because every started mini-batch is finished:
this peer's running batches count in full, the other peers' (extrapolated by their throughput, see
:func:`peer.swarm_view.swarm_samples`) half a batch each on average, so the round ends near the
target instead of a batch per peer past it. A fast peer thus contributes more samples than a slow
one, and nobody idles for a fixed share.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from peer.swarm_view import ProgressBoard, swarm_samples
from protocol.corroboration import corroborated_max

logger = logging.getLogger(__name__)

PUBLISH_EVERY = 1.0  # seconds between this peer's progress records while it computes
# ... and while it averages the round it computed: a third of PROGRESS_TTL, so that a newcomer sees
# the round is still the swarm's (it sits the attempt out instead of computing a round too late)
AVERAGING_PUBLISH_EVERY = 10.0
FRESH_MS = 10_000  # a progress record this recent (ms) shows which round its peer computes
# How old a read of the board may be when it is looked at again (each read fetches every peer's
# record): READ_EVERY near the round's target; while computing, half the time the swarm needs to reach
# it, at most READ_EVERY_MAX (others' records are extrapolated for at most 2 s, swarm_view.py);
# SUPERSEDED_READ_EVERY for the averaging's check that the swarm moved on (a rare event).
READ_EVERY = 0.5
READ_EVERY_MAX = 2.0
SUPERSEDED_READ_EVERY = 3.0
# Another peer's progress record counts for at most this many times the most samples it contributed
# to one of its recent committed rounds (plus two batches): its count is its word, and one record
# claiming a huge count would otherwise end every peer's computation at once. One with no committed
# round yet counts for at most half the target (it cannot close a round alone).
HISTORY_FACTOR = 2.0
HISTORY_ROUNDS = 8


@dataclass(frozen=True)
class SwarmEstimate:
    """One look at the round: this host's samples, the others', and the projection that decides."""

    own: float
    others: float
    projected: float
    throughput: float  # this peer's samples/s, as the others extrapolate it
    swarm_round: int = -1  # the latest round another peer's fresh record shows it computing

    @property
    def swarm(self) -> float:
        return self.own + self.others


class SwarmProgress:
    """This peer's view of the swarm's progress in one round at a time (one thread uses it; the thread of
    :meth:`averaging` only publishes)."""

    def __init__(
        self,
        board: ProgressBoard,
        peer_id: str,
        batch_size: int,
        devices: int,
        target: int,
        *,
        rounds_by_cohort: bool = False,
        traffic: Callable[[], tuple[int, int]] | None = None,
        data: Callable[[], tuple[str, int, int]] | None = None,
    ):
        self.board, self.peer_id = board, peer_id
        # sync = "outer": cohorts take their inner steps apart, so only this peer's own cohort tells it
        # that it is behind (the others' samples still count towards the round's target: lockstep)
        self.rounds_by_cohort = rounds_by_cohort
        # (outer steps taken, cross-cohort bytes) for every record: what the dashboard shows
        self.traffic: Callable[[], tuple[int, int]] = traffic or (lambda: (0, 0))
        # (shards held as a bitmap, shard bytes served, fetched) in tasks on shards (peer.data_feed)
        self.data: Callable[[], tuple[str, int, int]] = data or (lambda: ("", 0, 0))
        self.batch_size, self.devices, self.target = batch_size, devices, target
        self.throughput = 0.0  # samples/s over the last round's computation (0: none measured yet)
        self._finished: tuple[int, int, float] | None = None  # (round, samples, loss) last computed
        self._round, self._cohort, self._state_round = -1, "", -1
        self._started = 0.0
        self._next_publish = 0.0
        self._records: list = []
        self._read_at = float("-inf")
        self._look_read_age = READ_EVERY  # how old a read may be at the next look (see READ_EVERY)
        # peers in the last roster this peer read (itself included; its cohort's, with
        # ``rounds_by_cohort``), set by each round's plan; 0 until one was read
        self.roster_peers = 0
        # keys of the last roster read (members only, set by each round's plan): other keys' records
        # count for nothing, so throw-away keys cannot move the swarm's round; None: none read yet
        self.members: frozenset[str] | None = None
        # peer id -> its sample counts in the last committed rounds it contributed to (newest last)
        self._committed: dict[str, list[int]] = {}

    def note_committed(self, contributors: Iterable[tuple[str, int]]) -> None:
        """A round committed with these (peer id, samples): what each showed it can do."""
        for peer, samples in contributors:
            history = self._committed.setdefault(peer, [])
            history.append(int(samples))
            del history[:-HISTORY_ROUNDS]

    def _cap(self, peer: str) -> float:
        history = self._committed.get(peer)
        if not history:
            return self.target / 2
        return HISTORY_FACTOR * max(history) + 2 * self.batch_size

    def _read(self, max_age: float = READ_EVERY) -> list:
        """Every peer's latest record, read from the DHT if the last read is ``max_age`` s old."""
        if time.monotonic() - self._read_at >= max_age:
            self._records, self._read_at = self.board.read(), time.monotonic()
        members = self.members
        return [r for r in self._records if members is None or r.public_key in members]

    def begin(self, round_index: int, cohort: str, state_round: int) -> None:
        self._round, self._cohort, self._state_round = round_index, cohort, state_round
        self._started = time.perf_counter()
        self._next_publish = 0.0
        self._look_read_age = READ_EVERY

    def look(self, samples: float, loss_sum: float) -> SwarmEstimate:
        """Publish this host's ``samples`` (at most every :data:`PUBLISH_EVERY` s) and project the swarm's
        total from everyone's latest records."""
        elapsed = time.perf_counter() - self._started
        # Only finished mini-batches are counted, so the rate within this round lags behind at first:
        # the last round's rate is the better figure once there is one.
        rate = self.throughput or samples / max(elapsed, 1e-6)
        if time.perf_counter() >= self._next_publish:
            self._next_publish = time.perf_counter() + PUBLISH_EVERY
            self._publish(samples, rate, loss_sum)
        records = self._read(self._look_read_age)
        now_ms = int(time.time() * 1000)
        others, other_peers = swarm_samples(records, self._round, now_ms, self.peer_id, cap=self._cap)
        projected = samples + self.devices * self.batch_size + others + other_peers * self.batch_size / 2
        swarm_rate = rate + sum(
            r.throughput_milli / 1000 for r in records if r.round == self._round and not r.averaging
        )
        to_target = max(0.0, self.target - projected) / max(swarm_rate, 1e-6)
        self._look_read_age = min(READ_EVERY_MAX, max(READ_EVERY, to_target / 2))
        return SwarmEstimate(samples, others, projected, rate, self._latest_round(records, now_ms))

    def swarm_round(self, fresh_ms: int = FRESH_MS, max_age: float = READ_EVERY) -> int:
        """The latest round another peer's progress record of the last ``fresh_ms`` shows it computing
        (-1: none), from a read at most ``max_age`` s old. While a peer averages a round it republishes
        its last record of it every :data:`AVERAGING_PUBLISH_EVERY` s (:meth:`averaging`): with
        ``fresh_ms`` above that, this is also the round the swarm is still averaging."""
        return self._latest_round(self._read(max_age), int(time.time() * 1000), fresh_ms)

    def _latest_round(self, records, now_ms: int, fresh_ms: int = FRESH_MS) -> int:
        """The latest round that two other peers show (:func:`protocol.corroboration.corroborated_max`):
        one rogue record of a far-off round must not make every peer believe it is behind. A lone
        fresh record counts only where its peer is the only other one on the board and in the
        roster (a swarm of two; at a swarm's start the liar's may be the only record yet): while the
        others are between rounds (their records go stale after ``fresh_ms``), a liar that keeps
        publishing would be the one fresh reporter, and stop every honest peer as "behind the swarm"."""
        others = [
            r
            for r in records
            if r.peer_id != self.peer_id and (not self.rounds_by_cohort or r.cohort_id == self._cohort)
        ]
        return corroborated_max(
            ((r.peer_id, r.round) for r in others if now_ms - r.timestamp < fresh_ms),
            lone_stands=len({r.peer_id for r in others}) <= 1 and self.roster_peers <= 2,
        )

    def target_reached(self, estimate: SwarmEstimate) -> bool:
        return estimate.projected >= self.target

    def finish(self, samples: int, loss: float) -> float:
        """The round's computation is over: measure this peer's throughput, publish the final count.
        Returns the computation's wall time."""
        wall = time.perf_counter() - self._started
        self.throughput = samples / max(wall, 1e-6)
        self._finished = (self._round, int(samples), float(loss))
        self._publish(samples, self.throughput, loss * samples)
        return wall

    @contextmanager
    def averaging(self, every: float = AVERAGING_PUBLISH_EVERY) -> Iterator[None]:
        """While the body runs (the averaging of the round :meth:`finish` ended), republish the round's
        final record every ``every`` s from a background thread, marked ``averaging``. Bounded: the
        thread is joined within 5 s of the body's end."""
        if self._finished is None or self._finished[0] != self._round:
            yield  # nothing computed in this round: nothing to show
            return
        _, samples, loss = self._finished
        stopping = threading.Event()

        def republish() -> None:
            while not stopping.wait(every):
                self._publish(samples, self.throughput, loss * samples, averaging=True)

        thread = threading.Thread(target=republish, name="manta-progress-averaging", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stopping.set()
            thread.join(timeout=5.0)

    def _publish(self, samples: float, throughput: float, loss_sum: float, averaging: bool = False) -> None:
        try:
            self.board.publish(
                self._round,
                int(samples),
                throughput,
                loss_sum / samples if samples else 0.0,
                self._cohort,
                self._state_round,
                self._finished,
                self.traffic(),
                # The store crosses the wide area: the computation's polling (and, at its end, the
                # round) must not wait for it.
                wait=False,
                data=self.data(),
                averaging=averaging,
            )
        except Exception as e:  # a transient DHT failure: the next report retries
            logger.debug(f"progress report failed: {e}")
