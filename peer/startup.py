"""Everything a volunteer's agent is made of, built in order: :func:`build_peer`.

The agent joins the DHT, fetches and verifies the task, opens the task's data, starts one worker per
device, and builds the parts that serve its state, post and read its reports and average its rounds.
A part that fails to start (an unreachable swarm, no task, no data) stops what was built before it
and raises :class:`PeerStartError`; what :func:`build_peer` returns is complete.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import random
import secrets
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import torch

from hivemind_adapter.dht import SwarmUnreachable, speaker
from hivemind_adapter.dht import peer_id as dht_peer_id
from hivemind_adapter.dial_back import serve_dial_back
from hivemind_adapter.group_keys import DeclarationSigner
from hivemind_adapter.p2p import Endpoint
from hivemind_adapter.process_answers import ProcessWatch
from hivemind_adapter.state_archive import StateArchive
from peer.affinity import cohort_on_lan, default_gateway_mac, host_id, network_id
from peer.averaging.factory import CohortAveragers, committer_for
from peer.averaging.stage import AveragingTimeouts
from peer.commit.boards import SignedCommitBoard
from peer.commit.certificate_channel import CertificateChannel
from peer.commit.certificate_relay import RelaySettings
from peer.commit.certified import CertificateVotes
from peer.commit.committer import RoundCommitter
from peer.control import ControlError, ControlServer, PeerControl
from peer.data_feed import DataFeed, DataUnavailable
from peer.devices import WorkerDevice
from peer.directory_view import DirectoryView
from peer.guard.conviction_watch import ConvictionWatch
from peer.membership import Membership, NotAdmitted
from peer.outer_round import OuterStepper
from peer.outer_step import OuterSettings
from peer.progress_display import ProgressDisplay
from peer.reachability import start_peer_dht
from peer.receipts import AggregatorLink, ReceiptCourier, ReceiptOutbox
from peer.roster_view import ADMISSION_READ_AGE, RosterView
from peer.run_policy import RunConditions, RunPolicy
from peer.search_service import EvaluationService
from peer.state_keeper import StateKeeper
from peer.stopping import StopSignals
from peer.swarm_progress import SwarmProgress
from peer.swarm_view import Announcer, ProgressBoard, fetch_task
from peer.worker import WorkerLimits
from peer.worker_fork import WaitingWorkers
from peer.worker_pool import WorkerPool
from peer.worker_protocol import SharedBuffers
from protocol.dht_schema import MantaRecordValidator, outer_board_id
from protocol.identity import Identity, IdentityError, fingerprint
from protocol.netaddr import parse_host_port
from protocol.peer_keys import Libp2pKey
from protocol.records import Affinity, DeviceInfo
from protocol.sealing import Sealed
from protocol.task_spec import TaskSpec
from supernet.outer_state import OuterState
from supernet.state import consensus_count, fresh_state_tensors
from supernet.workload import Workload, swarm_train_options, workload_for
from tasks.shards.local import local_shard_task

logger = logging.getLogger("manta.peer")


@dataclass(frozen=True)
class JoinConfig:
    """What ``manta-peer join`` was asked to do (its options, checked)."""

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
    timeouts: AveragingTimeouts = AveragingTimeouts()
    threads: int | None = None  # torch threads per worker (--max-threads; None: the cores shared out)
    limits: WorkerLimits = WorkerLimits()  # --cpu-share, --gpu-memory
    run_policy: RunPolicy = RunPolicy()  # --run-mode and its idle thresholds
    invite: str = ""  # --invite: the token a task admitting by invitation asks for


class PeerStartError(RuntimeError):
    """The peer cannot start (unreachable swarm, no task, no data); one line for the volunteer."""


@dataclass(frozen=True)
class PeerParts:
    """What :func:`build_peer` built, each part running."""

    dht: Any
    dht_watch: ProcessWatch
    peer_id: str
    roster: RosterView
    directory: DirectoryView | None  # the cohort directory rounds plan from (commit = "certificates")
    spec: Sealed[TaskSpec]
    endpoint: Endpoint
    data: DataFeed | None  # tasks on an operator's dataset (TaskSpec.data)
    search: EvaluationService
    announcer: Announcer
    outbox: ReceiptOutbox
    courier: ReceiptCourier
    workload: Workload
    shared: SharedBuffers
    workers: WorkerPool
    outer: OuterStepper | None  # sync = "outer" tasks only
    archive: StateArchive
    commits: RoundCommitter
    convictions: ConvictionWatch
    averagers: CohortAveragers
    progress: SwarmProgress
    state: StateKeeper
    control: PeerControl  # what `manta-peer pause | resume | status` read and set
    control_server: ControlServer
    conditions: RunConditions  # the run mode's verdict: may the machine be used now


@dataclass(frozen=True)
class PeerKinds:
    """The classes :func:`build_peer` makes the replaceable parts of (the test suite's dishonest
    peers substitute them; an honest peer uses the defaults)."""

    evaluation_service: Callable[..., EvaluationService] = EvaluationService
    state_keeper: type[StateKeeper] = StateKeeper


def build_peer(
    config: JoinConfig,
    identity: Identity,
    devices: Sequence[WorkerDevice],
    signals: StopSignals,
    display: ProgressDisplay,
    kinds: PeerKinds = PeerKinds(),
    waiting: WaitingWorkers | None = None,
) -> PeerParts:
    """Build and start every part of a peer (see the module docstring). A process the peer cannot go
    on without that ends later stops it through ``signals`` (:meth:`StopSignals.lose`). Raises
    :class:`PeerStartError` (after stopping what it built) if the swarm, the task or its data
    cannot be reached. ``waiting``: processes forked to become the workers (:mod:`peer.worker_fork`)."""
    started = time.monotonic()
    with contextlib.ExitStack() as built:
        config.data_dir.mkdir(parents=True, exist_ok=True)
        control = PeerControl()
        try:
            control_server = ControlServer(config.data_dir, control.handle)
        except ControlError as e:
            raise PeerStartError(str(e)) from None
        built.callback(control_server.close)
        try:  # a node the swarm cannot connect to runs in client mode (peer/reachability.py)
            dht, client_mode = start_peer_dht(
                config.initial_peers, config.listen, config.announce, config.client_mode,
                Libp2pKey.load_or_create(config.data_dir / "libp2p.key"),
            )  # fmt: skip
        except (SwarmUnreachable, IdentityError) as e:
            raise PeerStartError(str(e)) from None
        built.callback(dht.shutdown)
        config = dataclasses.replace(config, client_mode=client_mode)
        dht_watch = ProcessWatch(
            dht, lambda code: signals.lose(_ended("DHT node", "can no longer reach the swarm"))
        )
        built.callback(dht_watch.stop)
        endpoint = Endpoint(dht, "manta-peer")  # every call this node makes or answers
        built.callback(endpoint.close)
        if not config.client_mode:
            serve_dial_back(endpoint)
        peer_id = dht_peer_id(dht)
        me = speaker(dht, identity)  # the MANTA key and the libp2p key, signing each other
        try:
            spec = fetch_task(dht, config.task_id, config.aggregator_key)
        except LookupError as e:
            raise PeerStartError(str(e)) from None
        task = spec.record
        dht.add_validators([MantaRecordValidator(task.task_id, aggregator_keys=tuple(task.aggregator_keys))])
        logger.info(
            f"peer {peer_id[-8:]} ({identity.fingerprint}) joined task {task.task_id}: {task.task}, "
            f"{task.mode}-parallel, aggregator {fingerprint(spec.public_key)}"
        )
        host = _announced_host(config)
        affinity = Affinity(host_id=host_id(), network_id=network_id(host, default_gateway_mac()))
        board = ProgressBoard(dht, task.task_id, me)
        link = AggregatorLink(dht, endpoint, task.task_id, tuple(task.aggregator_keys))
        membership = Membership(
            link, task.task_id, tuple(task.aggregator_keys), me, config.data_dir / "membership.sealed",
            invite=config.invite,
        )  # fmt: skip
        try:
            membership.obtain()  # before it announces: without a certificate it counts in no roster
        except NotAdmitted as e:
            raise PeerStartError(str(e)) from None
        membership.keep_renewed()
        built.callback(membership.stop)
        data = None
        if task.data is not None:
            data = DataFeed(
                endpoint, task, board, lambda: list(link.aggregators().values()), peer_id,
                config.data_dir / "data", config.cache_bytes, display,
                whole_dataset=config.whole_dataset, started=started,
            )  # fmt: skip
            built.callback(data.close)
            try:
                data.open()
            except DataUnavailable as e:
                raise PeerStartError(str(e)) from None
        # The aggregator's search may ask this peer to evaluate sub-networks (peer/search_service.py).
        search = kinds.evaluation_service(
            endpoint, task.task_id, tuple(task.aggregator_keys), config.data_dir,
            validation_task=data.validation_task if data is not None else None,
        )  # fmt: skip
        built.callback(search.shutdown)
        announcer = Announcer(
            dht, me, task.task_id,
            tuple(DeviceInfo(kind=d.kind, name=d.name[:256], memory_mb=d.memory_mb) for d in devices),
            affinity, config.cohort, membership.wire,
            throughput=1.0,  # the measured figure replaces it after a round
        )  # fmt: skip
        outbox = ReceiptOutbox(config.data_dir / "receipts", identity)
        courier = ReceiptCourier(outbox, link, announcer.binding)
        built.callback(courier.stop, flush_seconds=0.0)
        workload, shared, consensus, workers = _start_workers(task, devices, peer_id, data, config, waiting)
        built.callback(workers.stop)
        outer = _outer_stepper(task, shared, consensus, workers, lambda cohort: averagers.outer(cohort))
        roster = RosterView(dht, task)
        # rounds whose certificates decide them plan from the aggregator's cohort directory
        directory = (
            DirectoryView(dht, endpoint, task, peer_id, lambda key: link.aggregators().get(key))
            if task.params.commit == "certificates"
            else None
        )

        def member_keys() -> dict[str, str]:  # the directory's members where one governs, or the roster's
            return (directory.member_keys() if directory is not None else {}) or roster.keys(
                ADMISSION_READ_AGE
            )

        commits = committer_for(
            SignedCommitBoard(dht, task.task_id, me), config.timeouts, roster.peer_ids,
            certificates=_certificate_votes(task, endpoint, identity, member_keys, built),
        )  # fmt: skip
        archive = StateArchive(endpoint, task.task_id, head=len(shared.grads))  # the parameters
        built.callback(archive.close)
        # reducers that told members different stories: found late, posted, read from others
        convictions = ConvictionWatch(dht, task.task_id, identity, lambda: averagers.public_keys())
        averagers = CohortAveragers(
            dht, task, shared.grads, timeouts=config.timeouts, client_mode=config.client_mode,
            serves_cohort=lambda cohort: cohort_on_lan(cohort, affinity.host_id, affinity.network_id, host or ""),
            round_commits=commits,
            outer_board=SignedCommitBoard(dht, outer_board_id(task.task_id), me),
            leaving=signals.stop.is_set, online=roster.peer_ids, on_new=signals.reclaim,
            on_ended=lambda why: signals.lose(f"{why}: the peer can no longer average; start manta-peer join again"),
            declarations=DeclarationSigner(task.task_id, me),  # matchmaking meets the roster's peers only
            admitted=member_keys,  # the round's own read, if recent
            convictions=convictions,
        )  # fmt: skip
        built.callback(averagers.shutdown)
        convictions.start()
        built.callback(convictions.stop)
        progress = SwarmProgress(
            board, peer_id, task.params.batch_size, len(devices), task.params.target_samples_per_round,
            rounds_by_cohort=task.params.sync == "outer",
            traffic=lambda: (outer.steps_taken if outer is not None else 0, averagers.cross_cohort_bytes()),
            data=data.holdings if data is not None else None,
        )  # fmt: skip
        state = kinds.state_keeper(
            task,
            dht,
            endpoint,
            peer_id,
            shared,
            consensus,
            workers,
            outer,
            archive,
            commits,
            progress,
        )
        conditions = RunConditions(config.run_policy, _own_pids)
        built.callback(conditions.stop)
        signals.reclaim()
        parts = PeerParts(
            dht, dht_watch, peer_id, roster, directory, spec, endpoint, data, search, announcer, outbox, courier, workload, shared,
            workers, outer, archive, commits, convictions, averagers, progress, state,
            control, control_server, conditions,
        )  # fmt: skip
        built.pop_all()  # from here on the node stops them (PeerNode.shutdown)
        return parts


def _certificate_votes(
    task: TaskSpec,
    endpoint: Endpoint,
    identity: Identity,
    member_keys: Callable[[], dict[str, str]],
    built: contextlib.ExitStack,
) -> CertificateVotes | None:
    """What a task whose rounds certificates decide votes with (None: its board decides)."""
    if task.params.commit != "certificates":
        return None
    channel = CertificateChannel(endpoint, task.task_id, RelaySettings(), random.Random(secrets.randbits(64)))
    built.callback(channel.close)  # after start-up the endpoint's close stops it
    logger.info("rounds commit on certificates: signed votes relayed among the cohorts decide them")
    return CertificateVotes(channel, identity, member_keys)


def _ended(part: str, consequence: str) -> str:
    """The one line a peer stops with when a part it cannot go on without ended."""
    return f"the peer's {part} stopped: it {consequence}; start manta-peer join again"


def _announced_host(config: JoinConfig) -> str | None:
    """The address others reach this peer at, for the network part of node affinity."""
    if config.announce:
        return parse_host_port(config.announce[0])[0]
    listen_host = parse_host_port(config.listen)[0]
    return listen_host if listen_host not in ("0.0.0.0", "::") else _primary_address()


def _primary_address() -> str | None:
    """This machine's address as its hostname resolves."""
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return None


def _own_pids() -> set[int]:
    """This peer's processes: the agent and every process it started."""
    me = psutil.Process()
    try:
        return {me.pid, *(p.pid for p in me.children(recursive=True))}
    except psutil.Error:
        return {me.pid}


def _start_workers(
    task: TaskSpec,
    devices: Sequence[WorkerDevice],
    peer_id: str,
    data: DataFeed | None,
    config: JoinConfig,
    waiting: WaitingWorkers | None,
) -> tuple[Workload, SharedBuffers, int, WorkerPool]:
    """One worker per device, sharing gradient and state buffers with this process."""
    torch.set_num_threads(1)  # the agent only averages; the cores belong to the workers
    train_options = swarm_train_options(task)
    worker_data = None
    if data is not None:
        # the agent needs the task's shapes only; its workers read the shards (tasks.shards.local)
        shard_task, _ = local_shard_task(task.data, data.directory)
        workload = workload_for(task.task, train_options, task=shard_task)
        worker_data = (task.data.model_dump_json(), str(data.directory))
    else:
        workload = workload_for(task.task, train_options)
    net = workload.build()
    optimizer = workload.cfg.optimizer  # the workers make it; the agent holds its state
    shared = SharedBuffers.create(list(net.parameters()), fresh_state_tensors(net, optimizer), len(devices))
    workers = WorkerPool(
        list(devices), shared, task_name=task.task, task_seed=task.seed, participant_prefix=peer_id,
        train_options=train_options, data=worker_data, threads=config.threads, limits=config.limits,
        waiting=waiting,
    )  # fmt: skip
    return workload, shared, consensus_count(net, optimizer), workers


def _outer_stepper(
    task: TaskSpec, shared: SharedBuffers, consensus: int, workers: WorkerPool, averager_for: Callable
) -> OuterStepper | None:
    """An outer task's stepper (None for every-step tasks)."""
    settings = OuterSettings.of_task(task.params)
    if settings is None:
        return None
    params = len(shared.grads)
    return OuterStepper(
        settings, OuterState.starting_at(shared.state[:params]), workers, shared.state, consensus,
        shared.state[params:consensus],  # the fresh inner optimizer state
        averager_for, mask_aware=task.mode == "model",
    )  # fmt: skip
