"""The bootstrap aggregator: a DHT node on a fixed port that seeds the swarm and publishes the task.

It runs a hivemind DHT node with a persistent libp2p identity (``<data-dir>/p2p.key``, so the
multiaddr printed for volunteers stays valid across restarts), registers the MANTA record validator
for its task (so it drops forged or malformed records, and so do the peers, which register the same),
publishes the sealed TaskSpec and re-stores it well before it expires. A second aggregator pointed
at the first (``--initial-peers``) with the same task id adopts the spec already published instead of
competing with it; either can bootstrap newcomers, and so can any running peer.

It also keeps the run's checkpoints (:mod:`aggregator.checkpoints`): it downloads the peers' state
every ``checkpoint_seconds`` and serves its newest checkpoint, so a run outlives its volunteers and
``--resume`` continues it. The sealed spec it publishes is saved as ``<data-dir>/task.sealed`` so a
resumed run publishes exactly the same task.
"""

from __future__ import annotations

import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from protocol.dht_schema import (
    TASKS_INDEX_KEY,
    MantaRecordValidator,
    open_peer_value,
    open_task_value,
    peers_key,
    task_key,
)
from protocol.identity import Identity
from protocol.logs import get_logger
from protocol.netaddr import host_port_to_multiaddr
from protocol.records import RecordRejected, Sealed, TaskSpec, seal

logger = get_logger(__name__)


MULTIADDRS_FILE = "multiaddrs.txt"  # in the data dir: where this aggregator's DHT node listens


@dataclass(frozen=True)
class BootstrapConfig:
    listen: str = "0.0.0.0:31337"
    announce: tuple[str, ...] = ()
    initial_peers: tuple[str, ...] = ()
    data_dir: Path = Path("manta-aggregator")
    refresh_seconds: float = 30.0  # re-store the task this often; it expires after 4x this
    checkpoint_seconds: float = 30.0  # download the swarm's state this often (0: no checkpoints)
    keep_checkpoints: int = 5
    resume: bool = False
    receipts: bool = True  # take contribution receipts into <data-dir>/ledger.sqlite
    audit_fraction: float = 0.1  # share of accepted receipts replayed by a spot audit
    # a round's receipts are appended at the latest this long after its first one arrived
    round_close_seconds: float = 20.0
    dashboard: str | None = None  # HOST:PORT of the web dashboard (aggregator/monitor/); None: none
    dashboard_fallback: bool = False  # that port taken: listen on a free one instead of failing


class BootstrapAggregator:
    def __init__(self, spec: TaskSpec, identity: Identity, config: BootstrapConfig):
        self.spec, self.identity, self.config = spec, identity, config
        self.task_id = spec.task_id
        self.dht = None
        self.published: Sealed[TaskSpec] | None = None
        self.keeper = None
        self.desk = None
        self.monitor = None
        self._stop = threading.Event()

    def start(self) -> list[str]:
        """Start the DHT node and publish the task; returns the multiaddrs peers should use."""
        import hivemind

        self.config.data_dir.mkdir(parents=True, exist_ok=True)
        if self.config.dashboard:
            self._open_dashboard()  # first: a taken port fails before the DHT node starts
        host = [host_port_to_multiaddr(self.config.listen, "--listen")]
        announce = [
            host_port_to_multiaddr(a, "--announce", allow_port_zero=False) for a in self.config.announce
        ]
        self.dht = hivemind.DHT(
            initial_peers=list(self.config.initial_peers),
            host_maddrs=host,
            announce_maddrs=announce or None,
            identity_path=str(self.config.data_dir / "p2p.key"),
            check_if_identity_free=False,
            record_validators=[MantaRecordValidator(self.task_id)],
            start=True,
        )
        self.published = self._choose_spec()
        (self.config.data_dir / "task.sealed").write_bytes(self.published.wire)
        self._publish()
        if self.config.checkpoint_seconds > 0 or self.config.resume or self.config.receipts:
            self._start_checkpoints()
        if self.config.receipts:
            self._open_desk()
        if self.monitor is not None:
            self._watch_swarm()
        maddrs = self.visible_maddrs()
        # For tools run later by the operator (manta-aggregator search) to find the swarm by themselves.
        (self.config.data_dir / MULTIADDRS_FILE).write_text("".join(f"{m}\n" for m in maddrs))
        return maddrs

    def _open_dashboard(self) -> None:
        """Serve the dashboard (raises aggregator.monitor.server.DashboardError if it cannot listen)."""
        from aggregator.monitor.service import Monitor

        self.monitor = Monitor(self.config.data_dir, self.identity.public_key)
        self.monitor.serve(self.config.dashboard, fallback=self.config.dashboard_fallback)

    def _watch_swarm(self) -> None:
        from aggregator.monitor.swarm_reader import read_swarm

        dht, task_id = self.dht, self.task_id
        self.monitor.watch(
            self.published.record,
            lambda: read_swarm(dht, task_id),
            multiaddrs=self.visible_maddrs(),
            task_data=self.keeper.workload.task if self.keeper is not None else None,
        )

    def _start_checkpoints(self) -> None:
        from aggregator.checkpoints import StateSharer
        from supernet.workload import swarm_train_options, workload_for

        task = self.published.record
        workload = workload_for(task.task, swarm_train_options(task))
        self.keeper = StateSharer(
            self.dht,
            self.task_id,
            workload,
            self.config.data_dir / "checkpoints",
            keep=self.config.keep_checkpoints,
        )
        if self.config.resume:
            self.keeper.resume()
        threading.Thread(target=self._state_loop, name="manta-states", daemon=True).start()

    def _open_desk(self) -> None:
        from aggregator.contributions import ContributionDesk

        self.desk = ContributionDesk(
            self.dht,
            self.identity,
            self.published.record,
            self.config.data_dir / "ledger.sqlite",
            workload=self.keeper.workload,
            states=self.keeper,
            audit_fraction=self.config.audit_fraction,
            close_after=self.config.round_close_seconds,
        )

    STATE_POLL_SECONDS = 2.0  # every round's state is downloaded (spot audits replay from it)

    def _state_loop(self) -> None:
        next_write = time.monotonic() + self.config.checkpoint_seconds
        while not self._stop.wait(self.STATE_POLL_SECONDS):
            try:
                self.keeper.download(timeout=30.0)
                if self.config.checkpoint_seconds > 0 and time.monotonic() >= next_write:
                    next_write = time.monotonic() + self.config.checkpoint_seconds
                    self.keeper.write_checkpoint()
            except Exception as e:  # no peer online, a peer left mid-download: try again next time
                logger.debug(f"state download failed: {type(e).__name__}: {e}")

    def visible_maddrs(self) -> list[str]:
        peer_id = self.dht.peer_id.to_base58()
        if self.config.announce:
            return [f"{host_port_to_multiaddr(a, '--announce')}/p2p/{peer_id}" for a in self.config.announce]
        return [str(m) for m in self.dht.get_visible_maddrs()]

    def _choose_spec(self) -> Sealed[TaskSpec]:
        """The saved spec when resuming; else adopt a spec another aggregator already publishes for
        this task id, else publish ours."""
        from protocol.records import open_sealed

        if self.config.resume:
            return open_sealed((self.config.data_dir / "task.sealed").read_bytes(), TaskSpec)
        found = self.dht.get(task_key(self.task_id), latest=True)
        if found is not None and isinstance(found.value, dict):
            for subkey, item in sorted(found.value.items()):
                try:
                    sealed = open_task_value(self.task_id, subkey, item.value)
                except RecordRejected:
                    continue
                if sealed.public_key != self.identity.public_key:
                    logger.info(f"adopting task {self.task_id} published by aggregator {subkey[:16]}")
                    return sealed
        return open_sealed(seal(self.spec, self.identity), TaskSpec)

    def _publish(self) -> bool:
        from hivemind.utils import get_dht_time

        expiration = get_dht_time() + 4 * self.config.refresh_seconds
        ok = self.dht.store(
            task_key(self.task_id), self.published.wire, expiration, subkey=self.published.public_key.hex()
        )
        indexed = self.dht.store(TASKS_INDEX_KEY, self.published.wire, expiration, subkey=self.task_id)
        if not (ok and indexed):
            logger.warning("the DHT did not accept the task record (will retry)")
        return bool(ok and indexed)

    def peers_online(self) -> int:
        found = self.dht.get(peers_key(self.task_id), latest=True)
        if found is None or not isinstance(found.value, dict):
            return 0
        count = 0
        for subkey, item in found.value.items():
            try:
                open_peer_value(self.task_id, subkey, item.value)
                count += 1
            except RecordRejected:
                pass
        return count

    def serve_forever(self) -> None:
        """Keep the task published and report the swarm until SIGINT/SIGTERM."""
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: self._stop.set())
        while not self._stop.wait(self.config.refresh_seconds):
            self._publish()
            logger.info(f"task {self.task_id}: {self.peers_online()} peer(s) online")

    def stop(self) -> None:
        self._stop.set()

    def shutdown(self) -> None:
        self._stop.set()
        if self.keeper is not None:
            self.keeper.stop_serving()  # before anything slow, so the grace overlaps the rest
        if self.monitor is not None:
            self.monitor.close()
            self.monitor = None
        if self.desk is not None:
            self.desk.shutdown()  # appends what is still queued first
            self.desk = None
        if self.keeper is not None:
            self.keeper.shutdown()
            self.keeper = None
        if self.dht is not None:
            self.dht.shutdown()
            self.dht = None
