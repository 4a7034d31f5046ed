"""`manta-peer join`: one volunteer's agent process and its round loop.

The agent joins the DHT, fetches and verifies the task, starts one worker per device
(:class:`peer.worker_pool.WorkerPool`), announces itself, and then runs rounds, each of which
:func:`peer.round.run_round` reads top to bottom: plan (roster, cohorts), compute until the swarm
has enough samples, commit to the host's gradient, average (cohort, across cohorts, back), apply the
same optimizer step everywhere or none, sign a receipt, publish the new state. This module is what
surrounds the rounds: start-up, catching up, the loop that retries aborted rounds, and shutdown.

A late joiner first downloads the newest state another peer serves (digest-checked) and continues
from the round after it, sitting out the round the swarm is computing when it arrives (the others
read their rosters without it); a peer whose round aborted looks for a newer state the same way, so
it catches up instead of drifting. Ctrl-C finishes the current round, catches up with a round the
others are still finishing (bounded), withdraws the announcement and stops every child process; a
second Ctrl-C abandons the round (or, after it, the wait).
"""

from __future__ import annotations

import json
import logging
import socket
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

from hivemind_adapter.dht import SwarmUnreachable, dht_gone, start_dht
from hivemind_adapter.dht import peer_id as dht_peer_id
from hivemind_adapter.group_keys import DeclarationSigner
from hivemind_adapter.p2p import Endpoint
from hivemind_adapter.process_answers import ProcessWatch
from hivemind_adapter.state_archive import StateArchive
from hivemind_adapter.state_sharing import StateSharer, peer_tiebreak
from peer.affinity import assign_cohorts, cohort_on_lan, default_gateway_mac, host_id, network_id
from peer.catch_up import (
    LEAVE_WAIT_SECONDS,
    SIT_OUT_SECONDS,
    anchored_rounds,
    catch_up_before_leaving,
    committed_state,
    sit_out_running_attempt,
    trusted_round,
)
from peer.cohort_averagers import CohortAveragers
from peer.conviction_watch import ConvictionWatch
from peer.data_feed import DataFeed, DataUnavailable
from peer.devices import WorkerDevice
from peer.hierarchy import AveragingTimeouts
from peer.outer_repair import missed_outer_state
from peer.outer_round import OuterStepper
from peer.outer_step import OuterSettings
from peer.progress_display import ProgressDisplay
from peer.receipts import AggregatorLink, ReceiptCourier, ReceiptOutbox
from peer.round import commit_pending, run_round
from peer.round_types import OuterReport, RoundContext, RoundReport
from peer.search_service import EvaluationService
from peer.stopping import StopSignals
from peer.swarm_progress import SwarmProgress
from peer.swarm_view import PROGRESS_TTL, Announcer, ProgressBoard, SignedCommitBoard, fetch_task, read_roster
from peer.worker_pool import WorkerPool
from peer.worker_protocol import SharedBuffers
from protocol.dht_schema import MantaRecordValidator, outer_board_id
from protocol.identity import Identity
from protocol.netaddr import host_port_to_multiaddr, parse_host_port
from protocol.records import Affinity, ContributionReceipt, DeviceInfo
from protocol.sealing import Sealed
from protocol.task_spec import TaskSpec
from supernet.checkpoint import save_checkpoint
from supernet.outer_state import OuterState, served_consensus, served_layout, split_served
from supernet.state import consensus_count, digest, fresh_state_tensors
from supernet.workload import Workload, swarm_train_options, workload_for
from tasks.shards.local import local_shard_task

logger = logging.getLogger("manta.peer")

SETTLE_SECONDS = 4.0  # after announcing, before the first round reads the roster
CATCH_UP_TRIES = 5  # state downloads in a row while the swarm stays ahead
MISSED_STEP_LOOKS = 3  # rounds that look for an outer step the others took and this peer missed


@dataclass(frozen=True)
class JoinConfig:
    initial_peers: tuple[str, ...]
    task_id: str | None = None
    aggregator_key: str | None = None
    cohort: str = "auto"
    listen: str = "0.0.0.0:0"
    announce: tuple[str, ...] = ()
    client_mode: bool = False
    data_dir: Path = Path("manta-peer")
    max_rounds: int | None = None
    until_round: int | None = None  # leave once the state is that of round until_round - 1
    cache_bytes: int = 10 << 30  # tasks on an operator's dataset: disk for cached shards (--cache-size)
    whole_dataset: bool = False  # train on every shard, not this peer's share (--whole-dataset)
    timeouts: AveragingTimeouts = field(default_factory=AveragingTimeouts)


class PeerStartError(RuntimeError):
    """The peer cannot start (unreachable swarm, no task, ...); one line for the volunteer."""


class PeerNode:
    """A volunteer's agent: start-up, the round loop, catching up and shutdown (the round itself is
    :func:`peer.round.run_round`). Every part is created in :meth:`start`; until then it is None."""

    def __init__(self, config: JoinConfig, identity: Identity, devices: list[WorkerDevice]):
        self.config, self.identity, self.devices = config, identity, devices
        self.reports: list[RoundReport] = []
        self._created = time.monotonic()  # what "time to the first training step" counts from
        self.display = ProgressDisplay()
        self.state_round = -1  # the round the current state is the result of (-1: the initial state)
        self.attempt = 0  # averaging attempts so far, swarm-wide (see run)
        self.state_digest = ""
        self._signals = StopSignals()
        self._dht_watch: ProcessWatch | None = None
        self._sharer_watch: ProcessWatch | None = None
        # why the peer cannot go on, once a process it needs (its DHT's, an averager's, its sharer's) ended
        self.swarm_lost: str | None = None
        self._stop = self._signals.stop  # set by the first Ctrl-C
        # what start() builds, in order
        self.dht = None
        self.peer_id = ""
        self.spec: Sealed[TaskSpec] | None = None
        self._tiebreak = 0
        self._endpoint: Endpoint | None = None
        self._search: EvaluationService | None = None
        self._announcer: Announcer | None = None
        self._announced_at = 0.0
        self._outbox: ReceiptOutbox | None = None
        self._courier: ReceiptCourier | None = None
        self.workload: Workload | None = None
        self._shared: SharedBuffers | None = None
        self._consensus = 0
        self._workers: WorkerPool | None = None
        self._outer: OuterStepper | None = None  # sync = "outer" tasks only
        # (attempt, looks left) of an outer exchange the others may have committed without this peer
        self._outer_missed: tuple[int, int] | None = None
        self._sharer: StateSharer | None = None
        self._archive: StateArchive | None = None
        self._averagers: CohortAveragers | None = None
        self._convictions: ConvictionWatch | None = None
        self._round: RoundContext | None = None
        self.data: DataFeed | None = None  # tasks on an operator's dataset (TaskSpec.data)

    # ------------------------------------------------------------------ start-up

    def start(self) -> None:
        self.config.data_dir.mkdir(parents=True, exist_ok=True)
        announce = [
            host_port_to_multiaddr(a, "--announce", allow_port_zero=False) for a in self.config.announce
        ]
        try:
            self.dht = start_dht(
                initial_peers=self.config.initial_peers,
                host_maddrs=[host_port_to_multiaddr(self.config.listen, "--listen")],
                announce_maddrs=announce or None,
                client_mode=self.config.client_mode,
                identity_path=str(self.config.data_dir / "p2p.key"),
            )
        except SwarmUnreachable as e:
            raise PeerStartError(str(e)) from None
        self._dht_watch = ProcessWatch(self.dht, self._dht_ended)
        # One endpoint for every call this node makes or answers (search, receipts, state archive).
        self._endpoint = Endpoint(self.dht, "manta-peer")
        self.peer_id = dht_peer_id(self.dht)
        self._tiebreak = peer_tiebreak(self.peer_id)
        try:
            self.spec = fetch_task(self.dht, self.config.task_id, self.config.aggregator_key)
        except LookupError as e:
            raise PeerStartError(str(e)) from None
        task = self.spec.record
        self.dht.add_validators([MantaRecordValidator(task.task_id)])
        # The aggregator's search may ask this peer to evaluate sub-networks (peer/search_service.py);
        # served from before the announcement, so a peer the search sees online can answer.
        self._search = self.open_evaluation_service(task)
        logger.info(
            f"peer {self.peer_id[-8:]} ({self.identity.fingerprint}) joined task {task.task_id}: {task.task}, "
            f"{task.mode}-parallel, aggregator {self.spec.public_key.hex()[:16]}"
        )
        if self.config.announce:
            host = parse_host_port(self.config.announce[0])[0]
        else:
            listen_host = parse_host_port(self.config.listen)[0]
            host = listen_host if listen_host not in ("0.0.0.0", "::") else _primary_address()
        affinity = Affinity(host_id=host_id(), network_id=network_id(host, default_gateway_mac()))
        self._announcer = Announcer(
            self.dht,
            self.identity,
            task.task_id,
            self.peer_id,
            tuple(DeviceInfo(kind=d.kind, name=d.name[:256], memory_mb=d.memory_mb) for d in self.devices),
            affinity,
            self.config.cohort,
            throughput=1.0,  # replaced by the measured figure after the first round
        )
        self._outbox = ReceiptOutbox(self.config.data_dir / "receipts", self.identity)
        link = AggregatorLink(self.dht, self._endpoint, task.task_id, tuple(task.aggregator_keys))
        self._courier = ReceiptCourier(self._outbox, link)
        board = ProgressBoard(self.dht, task.task_id, self.identity, self.peer_id)
        if task.data is not None:
            self.data = DataFeed(
                self._endpoint, task, board, lambda: list(link.aggregators().values()), self.peer_id,
                self.config.data_dir / "data", self.config.cache_bytes, self.display,
                whole_dataset=self.config.whole_dataset, started=self._created,
            )  # fmt: skip
            try:
                self.data.open()
            except DataUnavailable as e:
                raise PeerStartError(str(e)) from None
        self._start_workers()
        self._sharer = StateSharer(
            [t.clone() for t in self._served_state()],
            self.dht,
            task.task_id,
            self._served_consensus(),
            client_mode=self.config.client_mode,
        )
        self._sharer_watch = ProcessWatch(self._sharer, self._sharer_ended)
        self._archive = StateArchive(self._endpoint, task.task_id)
        self._commit_board = SignedCommitBoard(self.dht, task.task_id, self.identity, self.peer_id)
        # reducers that told members different stories: found late, posted, read from others
        self._convictions = ConvictionWatch(
            self.dht, task.task_id, self.identity, lambda: self._averagers.public_keys()
        ).start()
        self._averagers = CohortAveragers(
            self.dht,
            task,
            self._shared.grads,
            timeouts=self.config.timeouts,
            client_mode=self.config.client_mode,
            serves_cohort=lambda cohort: cohort_on_lan(
                cohort, affinity.host_id, affinity.network_id, host or ""
            ),
            round_board=self._commit_board,
            outer_board=SignedCommitBoard(
                self.dht, outer_board_id(task.task_id), self.identity, self.peer_id
            ),
            leaving=self._stop.is_set,
            online=lambda: [p.entry.peer_id for p in read_roster(self.dht, task.task_id)],
            on_new=self._signals.reclaim,
            on_ended=self._averager_ended,
            # matchmaking declares signed and meets the roster's peers only
            declarations=DeclarationSigner(task.task_id, self.identity),
            admitted=lambda: {
                p.entry.peer_id: p.announcement.public_key for p in read_roster(self.dht, task.task_id)
            },
            convictions=self._convictions,
        )
        self._progress = SwarmProgress(
            board,
            self.peer_id,
            task.params.batch_size,
            len(self.devices),
            task.params.target_samples_per_round,
            rounds_by_cohort=task.params.sync == "outer",
        )
        self._progress.traffic = lambda: (
            self._outer.steps_taken if self._outer is not None else 0,
            self._averagers.cross_cohort_bytes(),
        )
        if self.data is not None:
            self._progress.data = self.data.holdings
        self._round = RoundContext(
            task=task,
            train_config=self.workload.cfg,
            peer_id=self.peer_id,
            identity=self.identity,
            dht=self.dht,
            workers=self._workers,
            progress=self._progress,
            announcer=self._announcer,
            outbox=self._outbox,
            display=self.display,
            stop=self._stop,
            averager_for=self._averagers.rounds,
            state_digest=lambda: self.state_digest,
            state_round=lambda: self.state_round,
            publish_state=self._publish_state,
            seal_receipt=self.receipt_wire,
            commit_board=self._commit_board,
            outer=self._outer,
            data=self.data,
        )
        self._signals.reclaim()

    def _start_workers(self) -> None:
        """Spawn one worker per device; they share gradient and state buffers with this process."""
        torch.set_num_threads(1)  # the agent only averages; the cores belong to the workers
        task = self.spec.record
        train_options = swarm_train_options(task)
        worker_data = None
        if self.data is not None:
            # the agent needs the task's shapes only; its workers read the shards (tasks.shards.local)
            shard_task, _ = local_shard_task(task.data, self.data.directory)
            self.workload = workload_for(task.task, train_options, task=shard_task)
            worker_data = (task.data.model_dump_json(), str(self.data.directory))
        else:
            self.workload = workload_for(task.task, train_options)
        net = self.workload.build()
        optimizer = self.workload.cfg.optimizer  # the workers make it; the agent holds its state
        self._shared = SharedBuffers.create(
            list(net.parameters()), fresh_state_tensors(net, optimizer), len(self.devices)
        )
        self._consensus = consensus_count(net, optimizer)
        self._workers = WorkerPool(
            self.devices,
            self._shared,
            task_name=task.task,
            task_seed=task.seed,
            participant_prefix=self.peer_id,
            train_options=train_options,
            data=worker_data,
        )
        settings = OuterSettings.of_task(task.params)
        if settings is not None:
            params = len(list(net.parameters()))
            self._outer = OuterStepper(
                settings,
                OuterState.starting_at(self._shared.state[:params]),
                self._workers,
                self._shared.state,
                self._consensus,
                self._shared.state[params : self._consensus],  # the fresh inner optimizer state
                lambda cohort: self._averagers.outer(cohort),  # built once the boards are
                mask_aware=task.mode == "model",
            )
        self.state_digest = digest(self._served_state()[: self._served_consensus()])

    # ------------------------------------------------------------------ rounds

    def catch_up(self) -> bool:
        """Adopt the newest state a quorum committed, fetched from all the peers that hold it
        (peer/catch_up.py); when the board knows none, the best state another node serves. Either
        only if it is ahead of ours: a newer round, or the same round and a quorum's result (or the
        server that wins the fixed tie-break). Returns whether the state was replaced."""
        task_id = self.spec.record.task_id
        roster = self._catch_up_roster()
        result, got = committed_state(
            self._commit_board, roster, self._endpoint, task_id, self._served_state(), self._served_consensus(),
            self.state_digest,
        )  # fmt: skip
        if result is not None and result.digest == self.state_digest:
            self.attempt = max(self.attempt, result.attempt + 1)
            return False  # this peer holds what the swarm committed last
        if result is None and self._outer is not None:
            # Between outer steps each cohort holds its own state, and the best state another node
            # serves is usually another cohort's. A cohort that split (a member whose first roster
            # missed its partner committed round 0 alone) then never met again: its members kept
            # loading the other site's states, one round apart (measured: 2 broadband runs of 30
            # rounds, no outer step committed). The newest state one of its own peers reports wins.
            result, got = committed_state(
                self._commit_board, roster, self._endpoint, task_id, self._served_state(),
                self._served_consensus(), self.state_digest, any_holder=True,
            )  # fmt: skip
            if result is not None and result.digest == self.state_digest:
                return False
        if got is None:
            got = self._sharer.download(timeout=30.0)
        if got is None:
            return False
        quorum = result is not None and got.digest == result.digest
        anchored: int | None = None
        if not quorum and got.digest != self.state_digest:
            anchored = anchored_rounds(self.dht, self.spec.record).get(got.digest)
            if anchored is None:
                logger.warning(
                    f"a state served by one node (round {got.round}, digest {got.digest[:12]}) that no quorum "
                    "committed and no aggregator anchored: not loaded"
                )
                return False
        round_index = trusted_round(got.round, anchored, self._progress.swarm_round())
        if round_index != got.round:
            logger.warning(
                f"a state served as the result of round {got.round} (digest {got.digest[:12]}) is taken for "
                f"round {round_index}: its round is not its server's to say"
            )
            got = replace(got, round=round_index)
        # Whatever we keep, the swarm has moved past the attempt that produced the served state.
        self.attempt = max(self.attempt, got.attempt + 1)
        if got.digest == self.state_digest or (got.round, got.tiebreak) <= (self.state_round, self._tiebreak):
            return False
        worker_state, outer = split_served(
            got.tensors, self._consensus, len(self._shared.state), len(self._shared.grads)
        )
        if (outer is None) != (self._outer is None):
            logger.warning("a served state of another synchronisation mode: ignored")
            return False
        self._workers.load(worker_state)
        if self._outer is not None:
            if result is None or got.digest != result.digest:
                # Served by one node, maybe of another cohort: its progress since that cohort's anchor
                # is not this peer's to send. This peer's period starts here.
                outer.anchor = [t.clone() for t in worker_state[: len(outer.anchor)]]
                outer.residue = [torch.zeros_like(t) for t in outer.residue]
            self._outer.replace_state(outer)
        self.state_round = got.round
        self._publish_state(got.round, got.attempt)
        source = f"from {len(result.holders)} holder(s)" if quorum else "anchored by the aggregator"
        logger.info(f"loaded the swarm's state after round {got.round} (digest {got.digest[:12]}, {source})")
        return True

    def _take_missed_outer_step(self) -> None:
        """Before a round, after an outer exchange that did not commit here: if the others committed
        it, take the outer state they reached (:mod:`peer.outer_repair`); until then, look again
        before the next rounds, at most :data:`MISSED_STEP_LOOKS` times (overlapped, the others take
        the step at the period's end where this peer saw the miss, and serve it a round later)."""
        attempt, tries = self._outer_missed
        # Each look may download a state across the wide area: a few rounds, then the miss stands.
        self._outer_missed = (attempt, tries - 1) if tries > 1 else None
        try:
            roster = [p.entry.peer_id for p in read_roster(self.dht, self.spec.record.task_id)]
            reached = missed_outer_state(
                self._averagers.outer_board, self._commit_board, self._endpoint, self.spec.record.task_id,
                attempt, roster, self.peer_id, self._outer.outer_digest(), self._served_state(),
                self._served_consensus(), (self._consensus, len(self._shared.state), len(self._outer.state.anchor)),
            )  # fmt: skip
        except Exception as e:  # the DHT may fail a read; the next round looks again
            logger.debug(f"could not look for outer step {attempt}'s state: {e}")
            return
        if reached is None:
            return
        self._outer.adopt_global(reached.global_params, reached.momentum)
        self._outer_missed = None
        self._publish_state(self.state_round, self.attempt)
        logger.info(
            f"outer step (attempt {attempt}) missed here: took the outer state the others reached "
            f"({self._outer.outer_digest()[:12]})"
        )

    def _publish_state(self, round_index: int, attempt: int) -> None:
        """Serve the current state to newcomers and keep it, by digest, for whoever needs it later."""
        served = self._served_state()
        self.state_digest = self._sharer.publish(round_index, served, attempt, self._tiebreak)
        self._archive.add(round_index, attempt, self.state_digest, served)

    def _served_state(self) -> list[torch.Tensor]:
        """What this peer serves and digests: the workers' state, with the outer state in outer tasks
        (:func:`supernet.outer_state.served_layout`)."""
        return served_layout(self._shared.state, self._consensus, self._outer.state if self._outer else None)

    def _served_consensus(self) -> int:
        return served_consensus(self._consensus, self._outer.state if self._outer else None)

    def _catch_up_roster(self) -> list[str]:
        """Whose committed states this peer may catch up with: the roster; in outer tasks only its
        cohort's peers (between outer steps each cohort holds its own state), when it has one."""
        entries = [p.entry for p in read_roster(self.dht, self.spec.record.task_id)]
        roster = [e.peer_id for e in entries]
        if self._outer is None:
            return roster
        assignment = assign_cohorts(entries, self.spec.record.params.max_group_size)
        mine = assignment.get(self.peer_id)
        return roster if mine is None else [p for p in roster if assignment.get(p) == mine]

    def _nobody_ahead(self) -> bool:
        """An outer task's inner steps: whether the last one committed and every peer of its cohort
        had posted for its attempt by then. None of them computes a later round, and looking (a read
        of every peer's progress across the wide area) can be skipped."""
        if self._outer is None:
            return False
        last = self.reports[-1] if self.reports else None
        averager = self._averagers.current
        seen = averager.everyone_posted if averager is not None else None
        return (
            last is not None
            and last.committed
            and not last.late
            and seen is not None
            and seen[0] == last.attempt
        )

    def catch_up_with_swarm(self) -> None:
        """Download states while the swarm computes a later round than ours (bounded: a state nobody
        serves yet ends it; the round loop looks again before the next round)."""
        for _ in range(CATCH_UP_TRIES):
            if self._round.progress.swarm_round() <= self.state_round + 1 or not self.catch_up():
                return

    def sit_out_round_in_progress(self) -> bool:
        """A newcomer arriving while the swarm computes the round it would join sits that attempt out
        and takes part from the next one (:func:`peer.catch_up.sit_out_running_attempt` says why). It
        downloads no state before the wait: the state that attempt commits is the one it needs, and
        each intermediate one cost a download (3-8 s each, two of them, on the churn benchmark).
        Returns whether it sat an attempt out."""
        # Computing or still averaging: over slow links a round's averaging outlasts the freshness of
        # its last compute record, and a newcomer that took such a swarm for idle joined an attempt
        # whose rosters lack it (measured: a joiner that never contributed in four minutes).
        running_round = self._round.progress.swarm_round(fresh_ms=int(PROGRESS_TTL * 1000))
        if running_round < self.state_round + 1 or self._stop.is_set():
            return False  # nobody works on the round we would join: it begins with us in every roster
        roster = read_roster(self.dht, self.spec.record.task_id)
        others = [p.entry.peer_id for p in roster if p.entry.peer_id != self.peer_id]

        def say(attempt: int) -> None:
            logger.info(
                f"the swarm is computing round {running_round} (attempt {attempt}): taking part from the "
                f"next one (waiting at most {SIT_OUT_SECONDS:.0f} s)"
            )

        sat_out = sit_out_running_attempt(self._commit_board, others, self._stop, say)
        if sat_out is None:
            return False  # a swarm that committed nothing yet: take part at once
        self.attempt = max(self.attempt, sat_out + 1)
        self.catch_up()
        return True

    def run(self) -> list[RoundReport]:
        self.catch_up()
        # Announced only now, holding the swarm's state with its workers running: a peer that is in
        # the roster is one that can average (the commit quorum counts the roster).
        self._announcer.announce()
        self._announcer.keep_fresh()
        self._announced_at = time.monotonic()
        if not self.sit_out_round_in_progress():
            # Let peers that started together find each other in the roster before the first round
            # (a newcomer that sat an attempt out was in the roster for all of it).
            time.sleep(max(0.0, SETTLE_SECONDS - (time.monotonic() - self._announced_at)))
        # The state we loaded came from an attempt that may have been followed by aborted ones: start
        # where the swarm is, as after every round (an older attempt meets nobody, and the others'
        # rosters then wait for this peer's report of an attempt it never takes part in).
        self.attempt = max(self.attempt, self._commit_board.latest_attempt() + 1)
        committed, failed_in_a_row = 0, 0
        while (
            not self._stop.is_set()
            and not self._reached_until_round()
            and (self.config.max_rounds is None or committed < self.config.max_rounds)
        ):
            # An aborted round whose result found its quorum since: the step the others took.
            t0 = time.perf_counter()
            if self._outer_missed is not None:
                self._take_missed_outer_step()
            report = commit_pending(self._round)
            if report is None:
                # A round computed from an old state could only abort: the others' groups are keyed by theirs.
                if not self._nobody_ahead():
                    self.catch_up_with_swarm()
                between = time.perf_counter() - t0
                try:
                    report = run_round(self._round, self.state_round + 1, self.attempt)
                except DataUnavailable as e:
                    logger.error(f"cannot train: {e}")
                    break
                report.cross_cohort_bytes = self._averagers.cross_cohort_bytes()
                if report.outer is not None:
                    self._record_outer(report.outer)
                # Every round, committed or aborted, is one attempt for the whole swarm; the next one is
                # past the highest any peer reached, so peers whose aborts took different times meet again.
                t0 = time.perf_counter()
                self.attempt = self._averagers.current.next_attempt(
                    self.attempt, within_cohort=self._outer is not None
                )
                # the round loop's own time around the round (results to commit late, catching up, the
                # next attempt): not in the round's seconds, but in the peer's wall time
                report.stages["between"] = round(between + time.perf_counter() - t0, 4)
            self.reports.append(report)
            # On a terminal the progress display shows the round; the full line goes to the debug log.
            (logger.debug if self.display.interactive else logger.info)(report.describe())
            self._record(report)
            self.display.round_done(report, self._round.roster_size, self._outbox.settled_credit())
            if report.committed:
                self.state_round = report.round
                committed, failed_in_a_row = committed + 1, 0
                if report.outer is not None and not self._stop.is_set():
                    # the others may have taken the outer step this peer missed: look before each round
                    self._outer_missed = (
                        None if report.outer.committed else (report.outer.attempt, MISSED_STEP_LOOKS)
                    )
            elif self._stop.is_set():
                break  # leaving: it catches up once, after the loop (leave_with_swarm_state)
            else:
                failed_in_a_row += 1
                self.catch_up()  # repairs divergence and brings us to the swarm's round
                limit = self.config.max_rounds or self.config.until_round
                if limit is not None and failed_in_a_row >= max(10, 3 * limit):
                    logger.warning(f"giving up after {failed_in_a_row} aborted rounds in a row")
                    break
        if self._averagers.current is not None:
            self._averagers.current.leave(self.attempt)  # the swarm's next attempt goes on without this peer
        if self._outer is not None:
            # End on the swarm's outer state: the exchange under way stepped, the cohort's own progress
            # since dropped (bounded: the exchange's stages and commit are).
            last = self._outer.finish()
            if last is not None:
                self._record_outer(last)
                logger.info(
                    f"the last outer step (attempt {last.attempt}): {'committed' if last.committed else 'aborted'}"
                    f"{'' if last.committed else ' (' + last.reason + ')'}, outer state {last.outer_digest[:12]}"
                )
            self._publish_state(self.state_round, self.attempt)
        if self._stop.is_set():
            self.leave_with_swarm_state()
        return self.reports

    def leave_with_swarm_state(self) -> None:
        """Ctrl-C: end on the state the swarm ends on, waiting (bounded) for a round the others are
        still finishing (:func:`peer.catch_up.catch_up_before_leaving` says why)."""

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
                    lambda: self._round.progress.swarm_round(fresh_ms=int(PROGRESS_TTL * 1000)),
                    self._commit_board,
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
        line = json.dumps({**asdict(outer), "peer_id": self.peer_id, "time": time.time()})
        with open(self.config.data_dir / "outer.jsonl", "a") as f:
            f.write(line + "\n")

    def _record(self, report: RoundReport) -> None:
        """Append the round to ``<data dir>/rounds.jsonl`` (what ``manta-swarm`` summarises)."""
        line = json.dumps({**asdict(report), "peer_id": self.peer_id, "time": time.time()})
        with open(self.config.data_dir / "rounds.jsonl", "a") as f:
            f.write(line + "\n")

    def save_state(self, path: Path | None = None) -> Path:
        """Write the current state as a supernet checkpoint (default ``<data dir>/final-state.pt``)."""
        return save_checkpoint(
            path or self.config.data_dir / "final-state.pt",
            self.workload,
            self._shared.state,
            self.state_round,
            meta={"task_id": self.spec.record.task_id, "peer_id": self.peer_id, "attempt": self.attempt},
        )

    # ------------------------------------------------------------------ what a test build may replace

    def receipt_wire(self, receipt: ContributionReceipt) -> bytes | None:
        """The bytes filed for ``receipt``; None: the receipt as this peer seals it. The test suite's
        dishonest peers (tests/adversaries/) override this to cheat; an honest peer never does."""
        return None

    def open_evaluation_service(self, task: TaskSpec) -> EvaluationService:
        """The service that answers the aggregator's search (a test build may substitute a liar)."""
        return EvaluationService(
            self._endpoint,
            task.task_id,
            tuple(task.aggregator_keys),
            self.config.data_dir,
            validation_task=(lambda: self.data.validation_task()) if task.data is not None else None,
        )

    # ------------------------------------------------------------------ stopping

    def install_signal_handlers(self) -> None:
        """Ctrl-C / SIGTERM: finish the round and leave; a second one abandons the round
        (:mod:`peer.stopping`)."""
        self._signals.install()

    def _dht_ended(self, exit_code: int | None) -> None:
        self._lose(
            f"the peer's DHT process ended (exit code {exit_code}): it can no longer reach the swarm; "
            "start manta-peer join again"
        )

    def _sharer_ended(self, exit_code: int | None) -> None:
        self._lose(
            f"the peer's state sharer process ended (exit code {exit_code}): it can neither serve the "
            "swarm's state nor fetch it; start manta-peer join again"
        )

    def _averager_ended(self, why: str) -> None:
        self._lose(f"{why}: the peer can no longer average; start manta-peer join again")

    def _lose(self, reason: str) -> None:
        """Stop the peer with one line: a process it cannot train without has ended (told once)."""
        if self.swarm_lost is not None:
            return
        self.swarm_lost = reason
        logger.error(reason)
        self._signals.lose(reason)

    def shutdown(self) -> None:
        """Leave: stop serving, deliver receipts (bounded), withdraw, stop workers and every process."""
        self._signals.closing()
        for watch in (self._dht_watch, self._sharer_watch):
            if watch is not None:
                watch.stop()  # the DHT and the state sharer are shut down on purpose below
        self.display.close()
        if self._sharer is not None:
            self._sharer.stop_serving()  # first: its grace for a transfer in flight overlaps the rest
        if self._search is not None:
            self._search.shutdown()
        # Without its DHT nothing reaches the swarm: the receipts stay in the outbox on disk for the next
        # start, instead of costing the exit a 15 s flush that delivers nothing, and the announcement
        # expires by itself. A peer that lost only an averager or its sharer still delivers both.
        reachable = self.dht is not None and not dht_gone(self.dht)
        if self._courier is not None:
            self._courier.stop(flush_seconds=15.0 if reachable else 0.0)
        if self._announcer is not None and reachable:
            try:
                self._announcer.withdraw()
            except Exception as e:  # the DHT may already be unreachable; the record then simply expires
                logger.debug(f"withdraw failed: {e}")
        if self._workers is not None:
            self._workers.stop()
        if self._convictions is not None:
            self._convictions.stop()
        if self._averagers is not None:
            self._averagers.shutdown()
        for part in (self._sharer,):
            if part is not None:
                try:
                    part.shutdown()
                except Exception:
                    pass
        if self._archive is not None:
            self._archive.close()
        if self.data is not None:
            self.data.close()
        if self._endpoint is not None:
            self._endpoint.close()
        if self.dht is not None:
            self.dht.shutdown()


def _primary_address() -> str | None:
    """This machine's address as its hostname resolves (for the network part of node affinity)."""
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return None
