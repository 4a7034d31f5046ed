"""`manta-peer join`: one volunteer's agent and its round loop.

:func:`peer.startup.build_peer` builds the agent's parts; :func:`peer.round.run_round` runs one round
top to bottom. This module is what surrounds the rounds: catching up before them, the loop that
retries aborted rounds, leaving with the swarm's state, and shutdown.

A late joiner first loads the newest state the swarm committed and sits out the round the swarm is
computing when it arrives (the others read their rosters without it). A peer whose round aborted
catches up the same way. Ctrl-C finishes the current round, catches up with a round the others are
still finishing (bounded), withdraws the announcement and stops every child process; a second
Ctrl-C abandons the round (or, after it, the wait).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict
from pathlib import Path

from hivemind_adapter.control_traffic import control_traffic
from hivemind_adapter.dht import dht_gone
from hivemind_adapter.runtime import return_free_memory
from peer.catch_up import (
    LEAVE_WAIT_SECONDS,
    SIT_OUT_SECONDS,
    await_attempt_end,
    catch_up_before_leaving,
    sit_out_running_attempt,
    swarm_runs_round,
    wait_for_settled_roster,
)
from peer.commit.quorum import newest_committed_state
from peer.data_feed import DataUnavailable
from peer.devices import WorkerDevice
from peer.directory_plan import NotListedYet, governing_directory
from peer.progress_display import ProgressDisplay
from peer.round import apply_pending_result, run_round
from peer.round_types import OuterReport, RoundContext, RoundReport
from peer.startup import JoinConfig, PeerKinds, PeerParts, build_peer
from peer.state_handoff import HANDOFF_SECONDS, hand_over_state
from peer.stopping import StopSignals
from peer.swarm_view import PROGRESS_TTL
from peer.worker_fork import WaitingWorkers
from protocol.identity import Identity
from protocol.record_lifetimes import commit_ttl
from protocol.records import ContributionReceipt
from protocol.state_handoff import StateHandoff
from supernet.checkpoint import save_checkpoint

logger = logging.getLogger("manta.peer")

SETTLE_SECONDS = 4.0  # peers starting together: the roster unchanged this long before the first round
SETTLE_LIMIT_SECONDS = 30.0  # ... or at most this long
PAUSE_POLL_SECONDS = 1.0  # how often a paused peer looks whether it may go on
CATCH_UP_TRIES = 5  # state downloads in a row while the swarm stays ahead
LISTED_LOOK_SECONDS = 5.0  # a peer no directory lists looks this often whether a new epoch does
LISTED_SAY_SECONDS = 60.0  # ... and says it still waits this often


class PeerNode:
    """A volunteer's running agent: the round loop, catching up and shutdown (the round itself is
    :func:`peer.round.run_round`). Made by :meth:`start`, complete when it returns."""

    # the classes of its replaceable parts (the test suite's dishonest peers substitute them)
    kinds = PeerKinds()

    def __init__(
        self,
        config: JoinConfig,
        identity: Identity,
        parts: PeerParts,
        signals: StopSignals,
        display: ProgressDisplay,
    ):
        self.config, self.identity, self.parts = config, identity, parts
        self._signals, self._stop, self.display = signals, signals.stop, display
        self.dht, self.peer_id, self.spec = parts.dht, parts.peer_id, parts.spec
        self._announcer, self._outbox, self._commits = parts.announcer, parts.outbox, parts.commits
        self.state = parts.state
        self.reports: list[RoundReport] = []
        self._announced_at = 0.0
        self._control_mark = control_traffic()  # what was sent before the round a report covers
        task = parts.spec.record
        self._round = RoundContext(
            task=task, train_config=parts.workload.cfg, peer_id=self.peer_id, identity=identity, dht=self.dht,
            roster=parts.roster,
            workers=parts.workers, progress=parts.progress, announcer=parts.announcer, outbox=parts.outbox,
            display=display, stop=self._stop, averager_for=parts.averagers.rounds,
            state_digest=lambda: self.state.state_digest, state_round=lambda: self.state.state_round,
            publish_state=self.state.publish, seal_receipt=self.receipt_wire, commits=parts.commits,
            outer=parts.outer, data=parts.data, directory=parts.directory,
        )  # fmt: skip
        self._committed = 0
        parts.control.update(
            state="running", peer_id=self.peer_id, task_id=task.task_id, run_mode=config.run_policy.mode,
            data_dir=str(config.data_dir),
        )  # fmt: skip

    @classmethod
    def start(
        cls,
        config: JoinConfig,
        identity: Identity,
        devices: list[WorkerDevice],
        signals: StopSignals,
        waiting: WaitingWorkers | None = None,
    ) -> PeerNode:
        """Build and start every part (:func:`peer.startup.build_peer`); raises
        :class:`~peer.startup.PeerStartError` with one line for the volunteer."""
        display = ProgressDisplay()
        parts = build_peer(config, identity, devices, signals, display, cls.kinds, waiting)
        return cls(config, identity, parts, signals, display)

    @property
    def state_round(self) -> int:
        return self.state.state_round

    @property
    def state_digest(self) -> str:
        return self.state.state_digest

    @property
    def attempt(self) -> int:
        return self._commits.attempt

    # ------------------------------------------------------------------ the loop

    def catch_up(self) -> bool:
        """:meth:`peer.state_keeper.StateKeeper.catch_up`."""
        return self.state.catch_up()

    def catch_up_with_swarm(self) -> None:
        """Download states while the swarm computes a later round than ours (bounded: a state nobody
        serves yet ends it; the round loop looks again before the next round)."""
        for _ in range(CATCH_UP_TRIES):
            if self.parts.progress.swarm_round() <= self.state_round + 1 or not self.catch_up():
                return

    def sit_out_round_in_progress(self) -> bool:
        """A newcomer arriving while the swarm computes (or still averages) the round it would join
        sits that attempt out and takes part from the next one (:func:`peer.catch_up.
        sit_out_running_attempt`), then loads the state it committed. Returns whether it sat one out."""
        roster = self.parts.roster.read()
        others = [p.entry.peer_id for p in roster if p.entry.peer_id != self.peer_id]
        if self._stop.is_set() or newest_committed_state(self._commits.board, others) is None:
            return False  # a swarm that committed nothing yet: its first peers start together

        def latest_round() -> int:
            return self.parts.progress.swarm_round(fresh_ms=int(PROGRESS_TTL * 1000))

        if not swarm_runs_round(latest_round, self.state_round + 1, self._stop):
            return False  # nobody works on the round we would join: it begins with us in every roster
        running_round = latest_round()

        def say(attempt: int) -> None:
            logger.info(
                f"the swarm is computing round {running_round} (attempt {attempt}): taking part from the "
                f"next one (waiting at most {SIT_OUT_SECONDS:.0f} s)"
            )

        sat_out = sit_out_running_attempt(
            self._commits.board, others, self._stop, say, online=self.parts.roster.peer_ids
        )
        if sat_out is None:
            return False  # a swarm that committed nothing yet: take part at once
        self._commits.skip_past(sat_out)
        self.catch_up()
        return True

    def wait_out_attempt(self, attempt: int) -> None:
        """After sitting ``attempt`` out behind the swarm: wait (bounded) until the swarm ends it
        (:func:`peer.catch_up.await_attempt_end`), then meet the swarm where it is. Computing the next
        round at once would run an attempt nobody runs yet, and move every peer's counter past it."""
        others = [p for p in self.parts.roster.peer_ids() if p != self.peer_id]
        logger.info(
            f"attempt {attempt}: waiting for the swarm to end it before catching up "
            f"(at most {SIT_OUT_SECONDS:.0f} s)"
        )
        started = time.monotonic()
        await_attempt_end(self._commits.board, others, attempt, self._stop, online=self.parts.roster.peer_ids)
        logger.info(f"attempt {attempt}: waited {time.monotonic() - started:.0f} s for its end; catching up")
        self._commits.meet_swarm()

    def wait_until_listed(self, not_listed: NotListedYet) -> None:
        """Until the directory that governs the swarm's next attempt lists this peer, or none does, or
        the peer is told to stop (looked at every :data:`LISTED_LOOK_SECONDS`, each look bounded):
        the swarm's rounds go on without it meanwhile. Then it waits (bounded) until the attempt
        before its first one ended, catches up with the state that attempt ends on and meets the swarm."""
        logger.info(f"{not_listed}: waiting")
        started = said = time.monotonic()
        while not self._stop.wait(LISTED_LOOK_SECONDS):
            self._commits.meet_swarm()
            whole = governing_directory(self.parts.directory, self._commits.attempt)
            if whole is None or whole.rank_of(self.peer_id) is not None:
                logger.info(
                    f"waited {time.monotonic() - started:.0f} s for a directory epoch that lists this peer"
                )
                if whole is not None:
                    # listed as the attempt before ends: a catch-up now would load the state before it
                    # (its holders had not reported the new one yet: seen, and the round computed then aborted)
                    others = [p for p in whole.keys() if p != self.peer_id]
                    await_attempt_end(self._commits.board, others, self._commits.attempt - 1, self._stop)
                break
            if time.monotonic() - said >= LISTED_SAY_SECONDS:
                said = time.monotonic()
                logger.info(f"still in no cohort of directory epoch {whole.header.epoch}: waiting")
        self.catch_up()
        self._commits.meet_swarm()

    def _roster_ids(self) -> frozenset[str]:
        return frozenset(self.parts.roster.peer_ids())

    def run(self) -> list[RoundReport]:
        """Train until stopped, ``max_rounds`` committed or ``until_round`` reached; the reports."""
        self.catch_up()
        # Announced only now, holding the swarm's state with its workers running: a peer in the roster
        # is one that can average (the commit quorum counts the roster).
        self._announcer.announce()
        self._announcer.keep_fresh()
        self._announced_at = time.monotonic()
        if not self.sit_out_round_in_progress():
            wait_for_settled_roster(self._roster_ids, self._stop, SETTLE_SECONDS, SETTLE_LIMIT_SECONDS)
        self._commits.meet_swarm()  # an older attempt meets nobody
        committed, failed_in_a_row = 0, 0
        outer, averagers = self.parts.outer, self.parts.averagers
        while (
            not self._stop.is_set()
            and not self._reached_until_round()
            and (self.config.max_rounds is None or committed < self.config.max_rounds)
        ):
            self._pause_while_asked()
            if self._stop.is_set():
                break
            t0 = time.perf_counter()
            self.state.take_missed_outer_step(averagers.outer_board)
            report = apply_pending_result(self._round)  # an aborted round whose result found its quorum since
            if report is None:
                # a round computed from an old state could only abort: the others' groups are keyed by theirs
                if not self._nobody_ahead():
                    self.catch_up_with_swarm()
                between = time.perf_counter() - t0
                try:
                    report = run_round(self._round, self.state_round + 1, self._commits.attempt)
                except DataUnavailable as e:
                    logger.error(f"cannot train: {e}")
                    break
                except NotListedYet as e:
                    self.wait_until_listed(e)
                    continue
                report.cross_cohort_bytes = averagers.cross_cohort_bytes()
                self._commits.board.ttl = commit_ttl(report.seconds)  # the board keeps it while the next runs
                if report.outer is not None:
                    self._record_outer(report.outer)
                # every round is one attempt for the whole swarm; the next is past the highest any peer reached
                t0 = time.perf_counter()
                self._commits.advance(averagers.current.own_cohort_peers() if outer is not None else None)
                report.stages["between"] = round(between + time.perf_counter() - t0, 4)
            now = control_traffic()
            sent, self._control_mark = now - self._control_mark, now
            report.control_messages, report.control_bytes = sent.messages, sent.bytes
            self.reports.append(report)
            # On a terminal the progress display shows the round; the full line goes to the debug log.
            (logger.debug if self.display.interactive else logger.info)(report.describe())
            self._record(report)
            self.display.round_done(report, self._round.roster_size, self._outbox.settled_credit())
            return_free_memory()  # the round's averaging buffers, freed, back to the kernel
            if report.committed:
                self.state.committed(report.round)
                committed, failed_in_a_row = committed + 1, 0
                self._committed += 1
            self._show_status(report)
            if report.committed:
                if report.outer is not None and not self._stop.is_set():
                    self.state.note_outer_step(report.outer.attempt, report.outer.committed)
            elif self._stop.is_set():
                break  # leaving: it catches up once, after the loop (leave_with_swarm_state)
            else:
                failed_in_a_row += 1
                if report.sat_out:
                    self.wait_out_attempt(report.attempt)
                self.catch_up()  # repairs divergence and brings us to the swarm's round
                limit = self.config.max_rounds or self.config.until_round
                if limit is not None and failed_in_a_row >= max(10, 3 * limit):
                    logger.warning(f"giving up after {failed_in_a_row} aborted rounds in a row")
                    break
        if averagers.current is not None:
            self._commits.leave(self._commits.attempt)  # the swarm's next attempt goes on without this peer
        if outer is not None:
            # End on the swarm's outer state: the exchange under way stepped, the cohort's own progress dropped.
            last = outer.finish()
            if last is not None:
                self._record_outer(last)
                logger.info(
                    f"the last outer step (attempt {last.attempt}): {'committed' if last.committed else 'aborted'}"
                    f"{'' if last.committed else ' (' + last.reason + ')'}, outer state {last.outer_digest[:12]}"
                )
            self.state.publish(self.state_round, self._commits.attempt)
        if self._stop.is_set():
            self.leave_with_swarm_state()
        return self.reports

    def _pause_reason(self) -> str | None:
        """Why the peer should not train now (the user's pause, or its run mode), or None."""
        if self.parts.control.paused_by_user():
            return "paused by the user (manta-peer resume goes on)"
        return self.parts.conditions.blocker()

    def _pause_while_asked(self) -> None:
        """Between rounds: while the user or the run mode says so, leave the cohort cleanly (a
        departure notice for the swarm's next attempt, the announcement withdrawn) and wait; then
        announce again and catch up, with the same key and whatever state the swarm still shares."""
        why = self._pause_reason()
        if why is None:
            return
        logger.info(f"pausing: {why}")
        self._commits.leave(self._commits.attempt)
        try:
            self._announcer.withdraw()
        except Exception as e:  # the DHT may be unreachable; the record then simply expires
            logger.debug(f"withdraw failed: {e}")
        while why is not None and not self._stop.is_set():
            self.parts.control.update(state="paused", reason=why)
            self._stop.wait(PAUSE_POLL_SECONDS)
            why = self._pause_reason()
        if self._stop.is_set():
            return
        self._announcer.announce()
        self._announcer.keep_fresh()
        self.catch_up()
        self._commits.meet_swarm()
        self.parts.control.update(state="running", reason="")
        logger.info("resumed")

    def _show_status(self, report: RoundReport) -> None:
        """What ``manta-peer status`` answers after this round."""
        self.parts.control.update(
            state="running", round=self.state_round, committed_rounds=self._committed, attempt=self._commits.attempt,
            last_round={"round": report.round, "committed": report.committed, "loss": report.loss,
                        "samples": report.samples, "reason": report.reason},
            roster=self._round.roster_size, state_digest=self.state_digest[:12],
        )  # fmt: skip

    def _nobody_ahead(self) -> bool:
        """An outer task's inner steps: whether the last one committed and every peer of its cohort
        had posted for its attempt by then (none computes a later round: no need to look)."""
        if self.parts.outer is None:
            return False
        last = self.reports[-1] if self.reports else None
        seen = self._commits.everyone_posted
        return (
            last is not None
            and last.committed
            and not last.late
            and seen is not None
            and seen[0] == last.attempt
        )

    def leave_with_swarm_state(self) -> None:
        """Ctrl-C: end on the state the swarm ends on, waiting (bounded) for a round the others are
        still finishing (:func:`peer.catch_up.catch_up_before_leaving`)."""

        def say(round_index: int) -> None:
            logger.info(
                f"leaving: the swarm is finishing round {round_index}; waiting at most "
                f"{LEAVE_WAIT_SECONDS:.0f} s to leave with its state (Ctrl-C again to leave now)"
            )

        # Out of the roster first: a round the others begin while this peer waits must not count it.
        try:
            self._announcer.withdraw()
        except Exception as e:  # the DHT may be unreachable; the record then simply expires
            logger.debug(f"withdraw failed: {e}")
        try:
            with self._signals.waiting_to_leave() as leave_now:
                catch_up_before_leaving(
                    self.catch_up,
                    lambda: self.state_round,
                    lambda: self.parts.progress.swarm_round(fresh_ms=int(PROGRESS_TTL * 1000)),
                    self._commits.board,
                    leave_now,
                    say,
                )
        except Exception as e:  # an unreachable DHT or holder: leave with the state this peer holds
            logger.warning(f"could not catch up with the swarm before leaving: {e}")

    def _reached_until_round(self) -> bool:
        until = self.config.until_round
        return until is not None and self.state_round + 1 >= until

    def _record_outer(self, outer: OuterReport) -> None:
        """Append an outer step to ``<data dir>/outer.jsonl`` (what ``manta-swarm`` counts)."""
        self._append("outer.jsonl", asdict(outer))

    def _record(self, report: RoundReport) -> None:
        """Append the round to ``<data dir>/rounds.jsonl`` (what ``manta-swarm`` summarises)."""
        self._append("rounds.jsonl", {**asdict(report), "roster": self._round.roster_size})

    def _append(self, name: str, record: dict) -> None:
        line = json.dumps({**record, "peer_id": self.peer_id, "time": time.time()})
        with open(self.config.data_dir / name, "a") as f:
            f.write(line + "\n")

    def save_state(self, path: Path | None = None) -> Path:
        """Write the current state as a supernet checkpoint (default ``<data dir>/final-state.pt``)."""
        return save_checkpoint(
            path or self.config.data_dir / "final-state.pt",
            self.parts.workload,
            self.parts.shared.state,
            self.state_round,
            meta={"task_id": self.spec.record.task_id, "peer_id": self.peer_id, "attempt": self.attempt},
        )

    def receipt_wire(self, receipt: ContributionReceipt) -> bytes | None:
        """The bytes filed for ``receipt``; None: the receipt as this peer seals it. Only the test
        suite's dishonest peers (tests/adversaries/) override this."""
        return None

    # ------------------------------------------------------------------ stopping

    def _hand_over_state(self) -> None:
        """Leave the state this peer ends on with the aggregators (:mod:`peer.state_handoff`), if a
        round of its own committed it (its commit reports name it for the aggregator)."""
        digest = self.state.state_digest
        last = next((r for r in reversed(self.reports) if r.committed and r.state_digest == digest), None)
        if last is None or last.attempt < 0:
            return
        handoff = StateHandoff(last.attempt, digest)
        hand_over_state(self.parts.courier.link, handoff, last.round, HANDOFF_SECONDS)

    def shutdown(self) -> None:
        """Leave: stop serving, deliver receipts (bounded), withdraw, stop workers and every process."""
        p = self.parts
        self._signals.closing()
        p.conditions.stop()
        p.control_server.close()
        p.dht_watch.stop()  # the DHT is shut down on purpose below
        self.display.close()
        p.search.shutdown()
        # Without its DHT nothing reaches the swarm: receipts stay in the outbox for the next start.
        reachable = not dht_gone(p.dht)
        p.courier.stop(flush_seconds=15.0 if reachable else 0.0)
        if reachable:
            try:
                p.announcer.withdraw()
            except Exception as e:  # the DHT may already be unreachable; the record then simply expires
                logger.debug(f"withdraw failed: {e}")
        p.workers.stop()
        p.convictions.stop()
        p.averagers.shutdown()
        if reachable:
            self._hand_over_state()
        p.archive.close()  # last: the aggregator may still fetch the start states of its audits
        if p.data is not None:
            p.data.close()
        p.endpoint.close()
        p.dht.shutdown()
