"""`manta-peer join`: one volunteer's agent process and its round loop.

The agent joins the DHT, fetches and verifies the task, starts one worker per device (see
:mod:`peer.worker`), announces itself, and then runs rounds::

    roster   = read_roster()                     # who is online, from signed announcements
    cohorts  = assign_cohorts(roster)            # node affinity, identical on every peer
    workers.compute(round)                       # mini-batches of this peer's sample stream with the
                                                 # round's sub-networks (all cohorts the same ones in
                                                 # data-parallel mode, each its own in model-parallel)
    until projected swarm samples >= target      # every peer publishes its progress; the round closes
                                                 # when the whole swarm (will have) reached the target
    outcome  = averager.average(round, ...)      # cohort -> across cohorts -> back (hivemind), exact,
                                                 # weighted by each peer's sample count
    workers.apply(round, outcome.committed)      # the same optimizer step everywhere, or none

A late joiner first downloads the newest state another peer serves (digest-checked) and continues
from the round after it; a peer whose round aborted looks for a newer state the same way, so it
catches up instead of drifting. Ctrl-C finishes the current round, withdraws the announcement and
stops every child process; a second Ctrl-C abandons the round.
"""

from __future__ import annotations

import json
import logging
import signal
import socket
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from hivemind_adapter.dht import SwarmUnreachable, start_dht
from hivemind_adapter.dht import peer_id as dht_peer_id
from hivemind_adapter.p2p import Endpoint
from hivemind_adapter.state_archive import StateArchive
from hivemind_adapter.state_sharing import StateSharer, peer_tiebreak
from peer.affinity import assign_cohorts, cohort_sizes, default_gateway_mac, host_id, network_id
from peer.devices import WorkerDevice
from peer.hierarchy import AveragingTimeouts, HierarchicalAverager
from peer.progress_display import ProgressDisplay
from peer.receipts import AggregatorLink, ReceiptCourier, ReceiptOutbox
from peer.search_service import EvaluationService
from peer.swarm_view import (
    Announcer,
    ProgressBoard,
    SignedCommitBoard,
    fetch_task,
    read_roster,
    swarm_samples,
)
from peer.worker import SharedBuffers, WorkerSpec, default_threads, worker_main
from protocol.dht_schema import MantaRecordValidator
from protocol.identity import Identity
from protocol.netaddr import host_port_to_multiaddr, parse_host_port
from protocol.records import (
    Affinity,
    ContributionReceipt,
    DeviceInfo,
    Sealed,
    TaskSpec,
    averaging_group_id,
)
from supernet.checkpoint import save_checkpoint
from supernet.contribution import contribution_sketch
from supernet.sketch import encode_sketch
from supernet.state import consensus_count, digest, init_optimizer_state, state_tensors
from supernet.training import phase_at
from supernet.workload import swarm_train_options, workload_for

logger = logging.getLogger("manta.peer")

SETTLE_SECONDS = 4.0  # after announcing, before the first round reads the roster
PROGRESS_EVERY = 1.0  # seconds between progress records while computing


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
    timeouts: AveragingTimeouts = field(default_factory=AveragingTimeouts)


class PeerStartError(RuntimeError):
    """The peer cannot start (unreachable swarm, no task, ...); one line for the volunteer."""


@dataclass
class RoundReport:
    round: int
    committed: bool
    samples: int
    loss: float
    cohort: str
    state_digest: str
    seconds: float
    contributors: int = 0
    reason: str = ""
    phase: str = ""
    lr: float | None = None
    swarm_samples: int = 0  # what the whole swarm processed in the round (from the contributors)
    subnets: list[str] = field(default_factory=list)  # hashes of the sub-networks this peer trained
    # where this peer's time went: its own mini-batches, the all-reduce stages (which include waiting
    # in matchmaking for the other peers), and the rest (commit reports, roster, optimizer step)
    times: dict[str, float] = field(default_factory=dict)
    # the same split by stage: compute, cohort, cross, broadcast, commit, other
    stages: dict[str, float] = field(default_factory=dict)
    attempt: int = -1  # the swarm-wide averaging attempt this round ran in


class PeerNode:
    def __init__(self, config: JoinConfig, identity: Identity, devices: list[WorkerDevice]):
        self.config, self.identity, self.devices = config, identity, devices
        self.dht = None
        self.spec: Sealed[TaskSpec] | None = None
        self.reports: list[RoundReport] = []
        self._stop = threading.Event()
        self._workers: list = []
        self._averager: HierarchicalAverager | None = None
        self._sharer: StateSharer | None = None
        self._announcer: Announcer | None = None
        self.state_round = -1  # the round the current state is the result of (-1: the initial state)
        self.attempt = 0  # averaging attempts so far, swarm-wide (see _run_round)
        self.state_digest = ""
        self.display = ProgressDisplay()
        self._measured_rate = 0.0  # samples/s over the last round's computation (0: none yet)
        self._finished: tuple[int, int, float] | None = None  # (round, samples, loss) last computed
        self._roster_size = 0

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
        # Announce before the (slow) worker start, so peers starting together see each other in time.
        self._announcer.announce()
        self._announcer.keep_fresh()
        self._announced_at = time.monotonic()
        self._progress = ProgressBoard(self.dht, task.task_id, self.identity, self.peer_id)
        self._outbox = ReceiptOutbox(self.config.data_dir / "receipts", self.identity)
        self._courier = ReceiptCourier(
            self._outbox, AggregatorLink(self.dht, self._endpoint, task.task_id, tuple(task.aggregator_keys))
        )
        self._start_workers()
        self._sharer = StateSharer(
            [t.clone() for t in self._state_buf],
            self.dht,
            task.task_id,
            self._consensus,
            client_mode=self.config.client_mode,
        )
        self._archive = StateArchive(self._endpoint, task.task_id)
        self._reclaim_signals()

    def _start_workers(self) -> None:
        """Spawn one worker per device; they share gradient and state buffers with this process."""
        torch.set_num_threads(1)  # the agent only averages; the cores belong to the workers
        task = self.spec.record
        self._train_options = swarm_train_options(task)
        self.workload = workload_for(task.task, self._train_options)
        net = self.workload.build()
        optimizer = self.workload.make_optimizer(net)
        init_optimizer_state(net, optimizer)
        self._shared = SharedBuffers.create(
            list(net.parameters()), state_tensors(net, optimizer), len(self.devices)
        )
        self._grad_buf, self._state_buf = self._shared.grads, self._shared.state
        self._consensus = consensus_count(net, optimizer)
        self.state_digest = digest(self._state_buf[: self._consensus])
        ctx = torch.multiprocessing.get_context("spawn")
        port = _free_port()
        threads = default_threads(len(self.devices))
        for rank, device in enumerate(self.devices):
            parent, child = ctx.Pipe()
            spec = WorkerSpec(
                rank,
                len(self.devices),
                device.torch_device,
                port,
                task.task,
                task.seed,
                f"{self.peer_id}/{rank}",
                self._train_options,
                threads,
            )
            proc = ctx.Process(target=worker_main, args=(spec, child, self._shared), daemon=True)
            proc.start()
            self._workers.append((proc, parent))

    def _send_workers(self, *msg) -> None:
        for _, conn in self._workers:
            conn.send(msg)

    def _replies(self, timeout: float | None = None) -> list | None:
        """Every worker's reply to the last request; None if one is still busy after ``timeout`` s."""
        deadline = None if timeout is None else time.monotonic() + timeout
        replies = []
        for proc, conn in self._workers:
            while not conn.poll(0.05):
                if not proc.is_alive():
                    raise RuntimeError(f"worker {proc.pid} died (exit code {proc.exitcode})")
                if deadline is not None and time.monotonic() > deadline:
                    return None
            replies.append(conn.recv())
        for reply in replies:
            if reply[0] == "error":
                raise RuntimeError(f"worker failed: {reply[1]}")
        return replies

    def _ask_workers(self, *msg) -> list:
        self._send_workers(*msg)
        return self._replies()

    # ------------------------------------------------------------------ rounds

    def catch_up(self) -> bool:
        """Adopt the best state another peer serves if it is ahead of ours: a newer round, or the same
        round from the peer that wins the fixed tie-break. Returns whether the state was replaced."""
        got = self._sharer.download(timeout=30.0)
        if got is None:
            return False
        # Whatever we keep, the swarm has moved past the attempt that produced the served state.
        self.attempt = max(self.attempt, got.attempt + 1)
        if got.digest == self.state_digest or (got.round, got.tiebreak) <= (self.state_round, self._tiebreak):
            return False
        for dst, src in zip(self._state_buf, got.tensors):
            dst.copy_(src)
        self._ask_workers("load")
        self.state_round = got.round
        self._publish_state(got.round, got.attempt)
        logger.info(f"loaded the swarm's state after round {got.round} (digest {got.digest[:12]})")
        return True

    def _publish_state(self, round_index: int, attempt: int) -> None:
        """Serve the current state to newcomers and keep it, by digest, for whoever needs it later."""
        self.state_digest = self._sharer.publish(round_index, self._state_buf, attempt, self._tiebreak)
        self._archive.add(round_index, attempt, self.state_digest, self._state_buf)

    def run(self) -> list[RoundReport]:
        task = self.spec.record
        self.catch_up()
        # Let peers that started together find each other in the roster before the first round.
        time.sleep(max(0.0, SETTLE_SECONDS - (time.monotonic() - self._announced_at)))
        committed, failed_in_a_row = 0, 0
        while (
            not self._stop.is_set()
            and not self._reached_until_round()
            and (self.config.max_rounds is None or committed < self.config.max_rounds)
        ):
            report = self._run_round(task, self.state_round + 1, self.attempt)
            self.reports.append(report)
            # Every round, committed or aborted, is one attempt for the whole swarm; the next one is past
            # the highest any peer reached, so peers whose aborts took different times meet again.
            self.attempt = self._averager.next_attempt(self.attempt)
            # On a terminal the progress display shows the round; the full line goes to the debug log.
            (logger.debug if self.display.interactive else logger.info)(
                f"round {report.round}: {'committed' if report.committed else 'aborted'}, loss {report.loss:.4f}, "
                f"{report.samples} samples in {report.seconds:.1f} s, {report.contributors} contributor(s), "
                f"cohort {report.cohort}, state {report.state_digest[:12]}, swarm {report.swarm_samples} samples, "
                f"phase {report.phase}, time compute {report.times['compute']:.1f} s / averaging "
                f"{report.times['averaging']:.1f} s / other {report.times['waiting']:.1f} s"
                + (f" ({report.reason})" if report.reason else "")
            )
            self._record(report)
            self.display.round_done(report, self._roster_size, self._outbox.settled_credit())
            if report.committed:
                self.state_round = report.round
                committed, failed_in_a_row = committed + 1, 0
            else:
                failed_in_a_row += 1
                self.catch_up()  # repairs divergence and brings us to the swarm's round
                limit = self.config.max_rounds or self.config.until_round
                if limit is not None and failed_in_a_row >= max(10, 3 * limit):
                    logger.warning(f"giving up after {failed_in_a_row} aborted rounds in a row")
                    break
        return self.reports

    def _reached_until_round(self) -> bool:
        until = self.config.until_round
        return until is not None and self.state_round + 1 >= until

    def _run_round(self, task: TaskSpec, round_index: int, attempt: int) -> RoundReport:
        """Train step ``round_index`` (data stream, sub-networks, learning rate) in averaging attempt
        ``attempt`` (what peers meet on; it never repeats, so a retried step starts from a clean slate)."""
        t0 = time.perf_counter()
        roster = read_roster(self.dht, task.task_id)
        if self.peer_id not in {p.entry.peer_id for p in roster}:
            self._announcer.announce()
            roster = read_roster(self.dht, task.task_id)
        self._roster_size = len(roster)
        assignment = assign_cohorts([p.entry for p in roster], task.params.max_group_size)
        cohort = assignment.get(self.peer_id, f"solo-{self.peer_id[-8:]}")
        cohort_ids = sorted(set(assignment.values()) | {cohort})
        sizes = cohort_sizes(assignment)
        self._ensure_averager(cohort)

        stats = self._compute(task, round_index, cohort, cohort_ids.index(cohort), len(cohort_ids))
        compute_s = stats["wall"]
        start_digest = self.state_digest
        work = self._commitments(task, round_index, stats)
        outcome = self._averager.average(
            attempt,
            self._grad_buf,
            stats["samples"],
            scale=stats["scale"],
            cohort_size=sizes.get(cohort, 1),
            num_cohorts=max(1, len(sizes)),
            state_digest=self.state_digest,
            expected_peers=[p.entry.peer_id for p in roster],
        )
        if outcome.committed:
            for dst, src in zip(self._grad_buf, outcome.tensors):
                dst.copy_(src)
        lr = self._ask_workers("apply", round_index, outcome.committed)[0][1]
        if outcome.committed and stats["samples"] > 0:
            self._write_receipt(task, round_index, attempt, cohort, stats, work, start_digest, outcome)
        if outcome.committed:
            self._publish_state(round_index, attempt)
        total = time.perf_counter() - t0
        averaging_s = sum(outcome.seconds.get(k, 0.0) for k in ("cohort", "cross", "broadcast"))
        return RoundReport(
            round_index,
            outcome.committed,
            stats["samples"],
            stats["loss"],
            cohort,
            self.state_digest,
            total,
            len(outcome.contributors),
            outcome.reason,
            phase=phase_at(round_index, self.workload.cfg).name,
            lr=lr,
            swarm_samples=sum(c["samples"] for c in outcome.contributors),
            subnets=list(stats["config_hashes"]),
            times=dict(
                compute=compute_s, averaging=averaging_s, waiting=max(0.0, total - compute_s - averaging_s)
            ),
            stages=_stage_times(total, compute_s, outcome.seconds),
            attempt=attempt,
        )

    def _compute(
        self, task: TaskSpec, round_index: int, cohort: str, cohort_rank: int, num_cohorts: int
    ) -> dict:
        """Let the workers train until the swarm has processed the round's target number of samples.

        This peer publishes its progress every :data:`PROGRESS_EVERY` s and reads everyone's; when the
        swarm's *projected* total reaches the target, it raises the workers' stop flag: they finish the
        mini-batch they are in and reduce inside the host. Projected, because every started mini-batch
        is finished: this peer's running batches count in full, the other peers' (extrapolated by their
        throughput, see :func:`swarm_samples`) half a batch each on average — so the round ends near the
        target instead of a batch per peer past it. A fast peer thus contributes more samples than a
        slow one, and nobody idles for a fixed share.
        """
        target = task.params.target_samples_per_round
        batch = task.params.batch_size
        self._shared.stop.zero_()
        self._shared.progress.zero_()
        started = time.perf_counter()
        self._send_workers("compute", round_index, task.mode, cohort_rank, num_cohorts)
        next_publish = 0.0
        replies = None
        while replies is None:
            samples, loss_sum, _ = (float(x) for x in self._shared.progress.sum(dim=0))
            elapsed = time.perf_counter() - started
            # What others extrapolate this peer's progress with: its rate over the last round (only
            # finished mini-batches are counted, so the rate within this round lags behind at first).
            throughput = self._measured_rate or samples / max(elapsed, 1e-6)
            if not int(self._shared.stop[0]):
                if time.perf_counter() >= next_publish:
                    next_publish = time.perf_counter() + PROGRESS_EVERY
                    self._publish_progress(round_index, samples, throughput, loss_sum, cohort)
                others, other_peers = swarm_samples(
                    self._progress.read(), round_index, int(time.time() * 1000), self.peer_id
                )
                projected = samples + len(self.devices) * batch + others + other_peers * batch / 2
                self.display.computing(round_index, samples, throughput, others + samples, target)
                if projected >= target or self._stop.is_set():
                    self._shared.stop[0] = 1
                    self.display.averaging(round_index)
            replies = self._replies(timeout=0.25)
        stats = replies[0][1]
        wall = time.perf_counter() - started
        self._measured_rate = self._announcer.throughput = stats["samples"] / max(wall, 1e-6)
        self._finished = (round_index, int(stats["samples"]), float(stats["loss"]))
        self._publish_progress(
            round_index,
            stats["samples"],
            self._announcer.throughput,
            stats["loss"] * stats["samples"],
            cohort,
        )
        return {**stats, "wall": wall}

    def _commitments(self, task: TaskSpec, round_index: int, stats: dict) -> dict:
        """What the receipt commits to, taken from the host's gradient before averaging replaces it."""
        try:
            sketch = encode_sketch(
                contribution_sketch(self._grad_buf, stats["samples"], task.seed, round_index)
            )
        except ValueError:  # a non-finite gradient: the receipt says so by carrying no sketch
            sketch = ()
        return dict(
            grad_commitment=digest(self._grad_buf),
            grad_sketch=sketch,
            worker_samples=tuple(int(x) for x in self._shared.progress[:, 0].tolist()),
        )

    def _write_receipt(self, task, round_index, attempt, cohort, stats, work, start_digest, outcome) -> None:
        """Sign this round's ContributionReceipt into the outbox (the courier delivers it)."""
        members = tuple(c["peer"] for c in outcome.contributors)
        samples = tuple(int(c["samples"]) for c in outcome.contributors)
        receipt = ContributionReceipt(
            task_id=task.task_id,
            round=round_index,
            peer_id=self.peer_id,
            public_key=self.identity.public_key_hex,
            seq=self._outbox.next_seq(),
            cohort_id=cohort,
            subnet_hashes=tuple(dict.fromkeys(stats["config_hashes"])),
            samples=stats["samples"],
            flops_per_sample=max(1, stats["train_macs"] // stats["samples"]),
            grad_commitment=work["grad_commitment"],
            state_digest=start_digest,
            group_id=averaging_group_id(task.task_id, attempt, members, samples, start_digest),
            group_members=members,
            timestamp=int(time.time() * 1000),
            group_samples=samples,
            worker_samples=work["worker_samples"],
            grad_sketch=work["grad_sketch"],
        )
        self._outbox.add(receipt, self.receipt_wire(receipt))

    # ------------------------------------------------------------------ what a test build may replace

    def receipt_wire(self, receipt: ContributionReceipt) -> bytes | None:
        """The bytes filed for ``receipt``; None: the receipt as this peer seals it. The test suite's
        dishonest peers (tests/adversaries/) override this to cheat; an honest peer never does."""
        return None

    def open_evaluation_service(self, task: TaskSpec) -> EvaluationService:
        """The service that answers the aggregator's search (a test build may substitute a liar)."""
        return EvaluationService(
            self._endpoint, task.task_id, tuple(task.aggregator_keys), self.config.data_dir
        )

    def _publish_progress(
        self, round_index: int, samples: float, throughput: float, loss_sum: float, cohort: str
    ) -> None:
        try:
            self._progress.publish(
                round_index,
                int(samples),
                throughput,
                loss_sum / samples if samples else 0.0,
                cohort,
                self.state_round,
                self._finished,
            )
        except Exception as e:  # a transient DHT failure: the next report retries
            logger.debug(f"progress report failed: {e}")

    def _record(self, report: RoundReport) -> None:
        """Append the round to ``<data dir>/rounds.jsonl`` (what ``manta-swarm`` summarises)."""
        line = json.dumps({**asdict(report), "peer_id": self.peer_id, "time": time.time()})
        with open(self.config.data_dir / "rounds.jsonl", "a") as f:
            f.write(line + "\n")

    def _ensure_averager(self, cohort: str) -> None:
        if self._averager is not None and self._averager.cohort == cohort:
            return
        if self._averager is not None:
            self._averager.shutdown()
        self._averager = HierarchicalAverager(
            self.dht,
            self.spec.record.task_id,
            cohort,
            self._grad_buf,
            timeouts=self.config.timeouts,
            client_mode=self.config.client_mode,
            cross_fp16=self.spec.record.params.cross_cohort_fp16,
            per_cohort=self.spec.record.mode == "model",
            commit_board=SignedCommitBoard(self.dht, self.spec.record.task_id, self.identity, self.peer_id),
        )
        self._reclaim_signals()

    def save_state(self, path: Path | None = None) -> Path:
        """Write the current state as a supernet checkpoint (default ``<data dir>/final-state.pt``)."""

        return save_checkpoint(
            path or self.config.data_dir / "final-state.pt",
            self.workload,
            self._state_buf,
            self.state_round,
            meta={"task_id": self.spec.record.task_id, "peer_id": self.peer_id, "attempt": self.attempt},
        )

    # ------------------------------------------------------------------ stopping

    def install_signal_handlers(self) -> None:
        """Ctrl-C / SIGTERM: finish the round and leave; a second one abandons the round.

        Called again after every hivemind averager is created: hivemind's ``run_in_background`` sets
        SIGINT to "ignore" in the *calling* process before it forks the averager, which would
        otherwise leave the volunteer with a peer that Ctrl-C cannot stop.
        """

        def on_interrupt(signum, frame):
            if self._stop.is_set():
                raise KeyboardInterrupt  # second Ctrl-C: abandon the round now
            logger.info("stopping after this round (Ctrl-C again to abandon it)")
            self._stop.set()

        self._signals_installed = True
        signal.signal(signal.SIGINT, on_interrupt)
        signal.signal(signal.SIGTERM, on_interrupt)

    def _reclaim_signals(self) -> None:
        if (
            getattr(self, "_signals_installed", False)
            and threading.current_thread() is threading.main_thread()
        ):
            self.install_signal_handlers()

    def shutdown(self) -> None:
        self.display.close()
        if self._sharer is not None:
            self._sharer.stop_serving()  # first: its grace for a transfer in flight overlaps the rest
        if getattr(self, "_search", None) is not None:
            self._search.shutdown()
        if getattr(self, "_courier", None) is not None:
            self._courier.stop(flush_seconds=15.0)
        if self._announcer is not None:
            try:
                self._announcer.withdraw()
            except Exception as e:  # the DHT may already be unreachable; the record then simply expires
                logger.debug(f"withdraw failed: {e}")
        for _proc, conn in self._workers:
            try:
                conn.send(("stop",))
            except OSError:
                pass
        for proc, _ in self._workers:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
        for part in (self._averager, self._sharer):
            if part is not None:
                try:
                    part.shutdown()
                except Exception:
                    pass
        if getattr(self, "_archive", None) is not None:
            self._archive.close()
        if getattr(self, "_endpoint", None) is not None:
            self._endpoint.close()
        if self.dht is not None:
            self.dht.shutdown()


def _stage_times(total: float, compute: float, seconds: dict[str, float]) -> dict[str, float]:
    stages = {"compute": compute} | {
        k: seconds.get(k, 0.0) for k in ("cohort", "cross", "broadcast", "commit")
    }
    stages["other"] = max(0.0, total - sum(stages.values()))
    return {k: round(v, 4) for k, v in stages.items()}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _primary_address() -> str | None:
    """This machine's address as its hostname resolves (for the network part of node affinity)."""
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return None
