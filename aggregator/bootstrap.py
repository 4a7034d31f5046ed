"""The bootstrap aggregator: a DHT node on a fixed port that seeds the swarm and publishes the task.

It runs a hivemind DHT node with a persistent libp2p identity (``<data-dir>/p2p.key``, so the
multiaddr printed for volunteers stays valid across restarts), registers the MANTA record validator
for its task (so it drops forged or malformed records, and so do the peers, which register the same),
publishes the sealed TaskSpec and re-stores it well before it expires. A second aggregator pointed
at the first (``--initial-peers``) with the same task id adopts the spec already published instead of
competing with it; either can bootstrap newcomers, and so can any running peer.

It also keeps the run's checkpoints (:mod:`aggregator.checkpoints`): every ``checkpoint_seconds`` it
fetches the newest committed state it has heard of (by digest, from the peers that held it) and
serves its newest checkpoint, so a run outlives its volunteers and ``--resume`` continues it; when it
stops, it writes a last one of the newest committed state (bounded, one line saying what it wrote).
The sealed spec it publishes is saved as ``<data-dir>/task.sealed`` so a resumed run publishes
exactly the same task. The monitor (:mod:`aggregator.monitor`) always follows the swarm and writes
the round history (``<data-dir>/rounds.jsonl``, and TensorBoard scalars with ``tensorboard``); the
dashboard serves it when ``dashboard`` is set.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from aggregator.admission import AdmissionDesk, MembershipPolicy, serve_admission
from aggregator.board_reads import AnnouncementReader
from aggregator.checkpoints import CheckpointKeeper
from aggregator.cohort_directory import DirectoryPublisher
from aggregator.contributions import ContributionDesk
from aggregator.join_line import MULTIADDRS_FILE
from aggregator.monitor.service import Monitor
from aggregator.monitor.swarm_reader import read_swarm
from aggregator.task_data import DataDesk
from hivemind_adapter.dht import peer_id as dht_peer_id
from hivemind_adapter.dht import read_signed, start_dht, store
from hivemind_adapter.dht import visible_maddrs as dht_visible_maddrs
from hivemind_adapter.dial_back import serve_dial_back
from hivemind_adapter.p2p import Endpoint
from hivemind_adapter.process_answers import ProcessWatch
from protocol.dht_schema import (
    TASKS_INDEX_KEY,
    MantaRecordValidator,
    anchor_key,
    open_peer_value,
    open_task_value,
    peers_key,
    task_key,
)
from protocol.identity import Identity, fingerprint
from protocol.netaddr import host_port_to_multiaddr
from protocol.peer_keys import Libp2pKey
from protocol.record_lifetimes import PUBLISHED_TTL, TASK_TTL
from protocol.records import StateAnchor
from protocol.sealing import Sealed, open_sealed, seal
from protocol.task_spec import TaskSpec
from supernet.workload import swarm_train_options, workload_for

logger = logging.getLogger(__name__)


FINAL_CHECKPOINT_SECONDS = 20.0  # the stop's last checkpoint waits this long for the state at most


@dataclass(frozen=True)
class BootstrapConfig:
    listen: str = "0.0.0.0:31337"
    announce: tuple[str, ...] = ()
    initial_peers: tuple[str, ...] = ()
    data_dir: Path = Path("manta-aggregator")
    refresh_seconds: float = 30.0  # re-store the task this often; it expires after 4x this
    checkpoint_seconds: float = 30.0  # checkpoint the newest committed state this often (0: none)
    keep_checkpoints: int = 5
    resume: bool = False
    receipts: bool = True  # take contribution receipts into <data-dir>/ledger.sqlite
    audit_fraction: float = 0.1  # share of accepted receipts replayed by a spot audit
    # a round's receipts are appended at the latest this long after its first one arrived
    round_close_seconds: float = 20.0
    dashboard: str | None = None  # HOST:PORT of the web dashboard (aggregator/monitor/); None: none
    dashboard_fallback: bool = False  # that port taken: listen on a free one instead of failing
    tensorboard: Path | None = None  # also write the round history as TensorBoard scalars here
    membership: MembershipPolicy = MembershipPolicy()  # whom it admits (aggregator/admission.py)


class ProcessLost(RuntimeError):
    """A process the aggregator cannot serve without ended (its DHT's: peers can no longer reach it);
    one line for the operator."""


class BootstrapAggregator:
    def __init__(self, spec: TaskSpec, identity: Identity, config: BootstrapConfig):
        self.spec, self.identity, self.config = spec, identity, config
        self.task_id = spec.task_id
        self.dht = None
        self.published: Sealed[TaskSpec] | None = None
        self.keeper = None
        self.desk = None
        self.directory = None
        self.admission: AdmissionDesk | None = None
        self.endpoint: Endpoint | None = None  # the desk's and the keeper's calls and handlers
        self.monitor = None
        self.data_desk: DataDesk | None = None  # tasks on an operator's dataset
        self._stop = threading.Event()
        self._dht_watch: ProcessWatch | None = None
        self.lost: str | None = None  # why it stopped serving, once its DHT's process ended
        self._served_anchor: StateAnchor | None = (
            None  # of the state the keeper serves (signed at each store)
        )

    def start(self) -> list[str]:
        """Start the DHT node and publish the task; returns the multiaddrs peers should use."""
        self.config.data_dir.mkdir(parents=True, exist_ok=True)
        self._open_monitor()  # first: a taken port, an unusable TensorBoard directory fail before the DHT
        host = [host_port_to_multiaddr(self.config.listen, "--listen")]
        announce = [
            host_port_to_multiaddr(a, "--announce", allow_port_zero=False) for a in self.config.announce
        ]
        libp2p_key = Libp2pKey.load_or_create(self.config.data_dir / "libp2p.key")

        def node(keys: tuple[str, ...]):  # the node's validator checks certificates against ``keys``
            return start_dht(
                initial_peers=self.config.initial_peers,
                host_maddrs=host,
                announce_maddrs=announce or None,
                libp2p_key=libp2p_key,
                validators=[MantaRecordValidator(self.task_id, aggregator_keys=keys)],
                # a process of its own: the swarm's bootstrap node keeps answering while audits and
                # the ledger keep this process busy
                in_thread=False,
            )

        expected = self._saved_spec().record if self.config.resume else self.spec
        self.dht = node(expected.aggregator_keys)
        self.published = self._choose_spec()
        if not set(self.published.record.aggregator_keys) <= set(expected.aggregator_keys):
            # the spec adopted names aggregators this node's validator does not know: start it anew
            self.dht.shutdown()
            self.dht = node(self.published.record.aggregator_keys)
        self._dht_watch = ProcessWatch(self.dht, self._dht_ended)
        self.endpoint = Endpoint(self.dht, "manta-aggregator")
        serve_dial_back(self.endpoint)  # joining peers learn whether the swarm can reach them
        self.admission = AdmissionDesk(
            self.identity, self.task_id, self.config.membership, self.config.data_dir / "members.jsonl"
        )
        serve_admission(self.endpoint, self.task_id, self.admission)  # before peers can see the task
        if self.published.record.data is not None:
            # serving before publishing: a peer that sees the task can fetch its shards
            self.data_desk = DataDesk(self.endpoint, self.published.record, self.config.data_dir)
        (self.config.data_dir / "task.sealed").write_bytes(self.published.wire)
        self._publish()
        if self.config.checkpoint_seconds > 0 or self.config.resume or self.config.receipts:
            self._start_checkpoints()
        if self.config.receipts:
            self._open_desk()
        if self.published.record.params.commit == "certificates":
            self._publish_directory()
        if self.monitor is not None and self.desk is not None:
            # the round history takes each round's figures from the receipts the ledger credited
            self.monitor.aggregates.crediting = True
            self.desk.on_closed = self.monitor.credit
        if self.monitor is not None:
            self._watch_swarm()
        maddrs = self.visible_maddrs()
        # For tools run later by the operator (manta-aggregator search) to find the swarm by themselves.
        (self.config.data_dir / MULTIADDRS_FILE).write_text("".join(f"{m}\n" for m in maddrs))
        return maddrs

    def _open_monitor(self) -> None:
        """The monitor, and the dashboard if asked for (DashboardError if it cannot listen;
        TensorBoardError if the TensorBoard log cannot be written). Checkpoints are evaluated only for
        the dashboard or TensorBoard."""
        tensorboard = None
        if self.config.tensorboard is not None:
            from aggregator.monitor.tensorboard import TensorBoardLog

            tensorboard = TensorBoardLog(self.config.tensorboard)
        self.monitor = Monitor(
            self.config.data_dir,
            self.identity.public_key,
            evaluate=bool(self.config.dashboard) or tensorboard is not None,
            tensorboard=tensorboard,
        )
        if self.config.dashboard:
            self.monitor.serve(self.config.dashboard, fallback=self.config.dashboard_fallback)

    def _watch_swarm(self) -> None:

        dht, task_id, keys = self.dht, self.task_id, self._aggregator_keys
        self.monitor.watch(
            self.published.record,
            lambda: read_swarm(dht, task_id, keys),
            multiaddrs=self.visible_maddrs(),
            task_data=self.keeper.workload.task if self.keeper is not None else None,
            data_served=self.data_desk.bytes_served if self.data_desk is not None else None,
        )

    def _start_checkpoints(self) -> None:

        task = self.published.record
        shard_task = self.data_desk.task if self.data_desk is not None else None
        workload = workload_for(task.task, swarm_train_options(task), task=shard_task)
        self.keeper = CheckpointKeeper(
            self.dht,
            self.endpoint,
            self.task_id,
            workload,
            self.config.data_dir / "checkpoints",
            keep=self.config.keep_checkpoints,
            outer_period=task.params.inner_steps if task.params.sync == "outer" else None,
        )
        self.keeper.on_serve = self._anchor
        if self.config.resume:
            self.keeper.resume()
        if self.config.checkpoint_seconds > 0:
            threading.Thread(target=self._checkpoint_loop, name="manta-checkpoints", daemon=True).start()

    def _open_desk(self) -> None:

        self.desk = ContributionDesk(
            self.dht,
            self.endpoint,
            self.identity,
            self.published.record,
            self.config.data_dir / "ledger.sqlite",
            workload=self.keeper.workload,
            states=self.keeper,
            audit_fraction=self.config.audit_fraction,
            close_after=self.config.round_close_seconds,
            admission=self.admission,
        )

    def _publish_directory(self) -> None:
        """Sign and serve the cohort directory (:mod:`aggregator.cohort_directory`), the roster that
        rounds decided by certificates are to count against (docs/protocol.md)."""
        task = self.published.record
        reader = self.desk.announcements if self.desk is not None else None
        if reader is None:
            reader = AnnouncementReader(self.dht, self.task_id, frozenset(task.aggregator_keys))
        witness = self.desk.witness if self.desk is not None else None
        self.directory = DirectoryPublisher(
            self.dht, self.endpoint, self.identity, task,
            lambda: [entry.announcement.record for entry in reader.read()],
            witness.newest_attempt if witness is not None else lambda: -1,
            self.admission.withdrawn,
        )  # fmt: skip
        self.directory.start()

    def _checkpoint_loop(self) -> None:
        """Every ``checkpoint_seconds``, and at once when an outer task's period-end state is learned."""
        newer = self.keeper.period_end_learned
        while not self._stop.is_set():
            newer.wait(self.config.checkpoint_seconds)
            newer.clear()
            if self._stop.is_set():
                break
            try:
                self.keeper.write_checkpoint(timeout=30.0)
            except Exception as e:  # a holder left mid-transfer, a disk error: try again next time
                logger.warning(f"checkpoint not written: {type(e).__name__}: {e}")

    def visible_maddrs(self) -> list[str]:
        if self.config.announce:
            own = dht_peer_id(self.dht)
            return [f"{host_port_to_multiaddr(a, '--announce')}/p2p/{own}" for a in self.config.announce]
        return dht_visible_maddrs(self.dht)

    def _saved_spec(self) -> Sealed[TaskSpec]:
        return open_sealed((self.config.data_dir / "task.sealed").read_bytes(), TaskSpec)

    def _choose_spec(self) -> Sealed[TaskSpec]:
        """The saved spec when resuming; else adopt a spec another aggregator already publishes for
        this task id, else publish ours."""
        if self.config.resume:
            return self._saved_spec()
        published = read_signed(
            self.dht, task_key(self.task_id), lambda sub, value: open_task_value(self.task_id, sub, value)
        )
        for sealed in sorted(published, key=lambda sealed: sealed.public_key):
            if sealed.public_key != self.identity.public_key:
                logger.info(
                    f"adopting task {self.task_id} published by aggregator {fingerprint(sealed.public_key)}"
                )
                return sealed
        return open_sealed(seal(self.spec, self.identity), TaskSpec)

    def _publish(self) -> bool:
        ttl = min(4 * self.config.refresh_seconds, TASK_TTL)
        ok = store(
            self.dht, task_key(self.task_id), self.published.wire, ttl, subkey=self.published.public_key.hex()
        )
        indexed = store(self.dht, TASKS_INDEX_KEY, self.published.wire, ttl, subkey=self.task_id)
        if not (ok and indexed):
            logger.warning("the DHT did not accept the task record (will retry)")
        return ok and indexed

    def _anchor(self, round_index: int, attempt: int, state_digest: str) -> None:
        """Sign the state the keeper now serves as one peers may load without a quorum's word
        (a resumed run: no peer holds it; protocol.records.StateAnchor), and keep it published."""
        record = StateAnchor(
            task_id=self.task_id,
            round=round_index,
            attempt=attempt,
            digest=state_digest,
            timestamp=int(time.time() * 1000),
            holder=self.endpoint.peer_id,
        )
        self._served_anchor = record
        self._publish_anchor()

    def _publish_anchor(self) -> None:
        """Store the anchor signed now: a copy lives ``PUBLISHED_TTL`` at most from its signed time."""
        if self._served_anchor is not None:
            fresh = self._served_anchor.model_copy(update={"timestamp": int(time.time() * 1000)})
            ttl = min(4 * self.config.refresh_seconds, PUBLISHED_TTL)
            store(self.dht, anchor_key(self.task_id), seal(fresh, self.identity), ttl,
                  subkey=self.identity.public_key_hex)  # fmt: skip

    @property
    def _aggregator_keys(self) -> frozenset[str]:
        return frozenset(self.published.record.aggregator_keys)

    def peers_online(self) -> int:
        return len(
            read_signed(
                self.dht,
                peers_key(self.task_id),
                lambda sub, v: open_peer_value(self.task_id, sub, v, self._aggregator_keys),
            )
        )

    def serve_forever(self) -> None:
        """Keep the task published and report the swarm until SIGINT/SIGTERM."""
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: self._stop.set())
        while not self._stop.wait(self.config.refresh_seconds):
            self._publish()
            self._publish_anchor()
            logger.info(f"task {self.task_id}: {self.peers_online()} peer(s) online")
        if self.lost is not None:
            raise ProcessLost(self.lost)

    def _dht_ended(self, exit_code: int | None) -> None:
        self._lose(
            f"the aggregator's DHT process ended (exit code {exit_code}): peers can no longer reach it; "
            "start manta-aggregator again (--resume continues the run)"
        )

    def _lose(self, why: str) -> None:
        if self.lost is not None:
            return
        self.lost = why
        logger.error(why)
        self._stop.set()

    def stop(self) -> None:
        self._stop.set()

    def shutdown(self) -> None:
        self._stop.set()
        if self.keeper is not None:
            self.keeper.period_end_learned.set()  # the checkpoint loop's wait ends with the stop
        if self._dht_watch is not None:
            self._dht_watch.stop()  # the DHT is shut down on purpose below
        if self.keeper is not None:
            self.keeper.stop_serving()
        if self.directory is not None:
            self.directory.stop()
            self.directory = None
        if self.desk is not None:
            # appends what is still queued first: the last rounds' states are learned, their figures credited
            self.desk.shutdown()
            self.desk = None
        if self.monitor is not None:
            self.monitor.close()
            self.monitor = None
        if self.keeper is not None and self.config.checkpoint_seconds > 0:
            try:
                logger.info(f"final checkpoint: {self.keeper.final_checkpoint(FINAL_CHECKPOINT_SECONDS)}")
            except Exception as e:  # a disk error: the rest of the shutdown still runs
                logger.warning(f"final checkpoint: none written: {type(e).__name__}: {e}")
        if self.keeper is not None:
            self.keeper.shutdown()
            self.keeper = None
        if self.data_desk is not None:
            self.data_desk.close()
            self.data_desk = None
        if self.endpoint is not None:
            self.endpoint.close()
            self.endpoint = None
        if self.dht is not None:
            self.dht.shutdown()
            self.dht = None
