"""The data a peer trains on, in a task on an operator's dataset: fetched from the swarm, checked,
cached under a size limit, prefetched, and served on to others.

Start-up (:meth:`DataFeed.open`): the shard list comes from the aggregator (or any peer that holds
it) and must hash to the Merkle root the task signed, else the peer refuses the task. Before every
round (:meth:`DataFeed.shards_for_round`): the peer's shards for the round's epoch follow from the task
seed and the roster (:mod:`tasks.shard_assignment`); those already on disk are what its workers draw
from, the rest and the next epoch's download in the background
(:class:`peer.shard_download.ShardDownloader`) from whoever holds them, the peers first, then the
aggregator. A peer that holds none of its shards
yet waits (bounded) for the first one, so a newcomer trains within one shard's download of joining.
The shards it holds are served to others (:class:`hivemind_adapter.shard_transfer.ShardServer`) and
advertised in its progress record (a bitmap), which is also where the dashboard counts holders.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from hivemind_adapter.p2p import Endpoint
from hivemind_adapter.paged_blobs import BlobServer, BlobUnavailable, fetch_from_any
from hivemind_adapter.shard_transfer import ShardServer
from peer.progress_display import ProgressDisplay
from peer.shard_cache import ShardCache
from peer.shard_download import ShardDownloader
from peer.swarm_view import ProgressBoard
from protocol.handler_names import manifest_handler, shard_handler
from protocol.shards import (
    MAX_MANIFEST_BYTES,
    DataManifest,
    ManifestMismatch,
    ShardEntry,
    check_manifest,
    held_shards,
    holdings_bitmap,
    manifest_bytes,
    parse_manifest,
)
from protocol.task_spec import TaskSpec
from tasks.shard_assignment import assigned_shards, rounds_per_epoch, within_budget
from tasks.shards.local import SHARDS_DIR, local_shard_task, write_manifest

logger = logging.getLogger("manta.peer")

HOLDERS_READ_EVERY = 5.0  # seconds between reads of who holds which shard
PREFETCH_AT_START = 2  # shards fetched before the first round's roster is known
FIRST_SHARD_SECONDS = 600.0  # the longest a peer waits for the first shard of its share
LOG_EVERY = 10.0  # progress lines while waiting, when not on a terminal


class DataUnavailable(RuntimeError):
    """The task's data cannot be had (no source for its shard list, a list that fails its root, or no
    shard of this peer's share within the wait); one line for the volunteer."""


class DataFeed:
    def __init__(
        self,
        endpoint: Endpoint,
        task: TaskSpec,
        board: ProgressBoard,
        aggregators: Callable[[], list[str]],
        peer_id: str,
        directory: Path,
        cache_bytes: int,
        display: ProgressDisplay,
        whole_dataset: bool = False,
        started: float | None = None,
    ):
        if task.data is None:
            raise ValueError("DataFeed is for tasks on an operator's dataset (TaskSpec.data)")
        self.endpoint, self.task, self.board = endpoint, task, board
        self.aggregators, self.peer_id, self.directory = aggregators, peer_id, Path(directory)
        self.display = display
        self.cache_bytes = cache_bytes
        # train on every shard (it downloads the whole dataset): the baseline a benchmark compares with
        self.whole_dataset = whole_dataset
        self.cache = ShardCache(self.directory / SHARDS_DIR, cache_bytes)
        self.manifest: DataManifest | None = None
        self._by_digest: dict[str, ShardEntry] = {}
        self._train: dict[int, ShardEntry] = {}
        self._holders: dict[int, list[str]] = {}
        self._holders_lock = threading.Lock()  # guards _holders and _holders_read_at
        self._holders_read_at = float("-inf")
        self._pins_lock = threading.Lock()  # guards the two lists of pinned digests below
        self._share_pins: list[str] = []  # shards the cache must keep: this peer's share ...
        self._validation_pins: list[str] = []  # ... and the validation split once asked for it
        self._validation_entries: tuple[ShardEntry, ...] = ()
        self._server: ShardServer | None = None
        self._manifest_server: BlobServer | None = None
        self.downloader: ShardDownloader | None = None
        # when the peer started (monotonic), and how long after it its first round had data to train on
        self.started = time.monotonic() if started is None else started
        self.first_step_seconds: float | None = None

    # ------------------------------------------------------------------ start-up

    def open(self, timeout: float = 60.0) -> DataManifest:
        """Fetch and check the shard list, then serve what this peer holds (raises DataUnavailable)."""
        data = self.task.data

        def checked(raw: bytes) -> DataManifest:
            manifest = parse_manifest(raw)
            check_manifest(manifest, data)  # ManifestMismatch is a ValueError: the next source is asked
            return manifest

        deadline = time.monotonic() + timeout
        last = "no aggregator or holder of the shard list found yet"
        while self.manifest is None:
            sources = [*self.aggregators(), *self._holders_of(None)]
            if sources:
                try:
                    self.manifest = fetch_from_any(
                        self.endpoint,
                        sources,
                        manifest_handler(self.task.task_id),
                        data.root,
                        checked,
                        timeout=20.0,
                        max_bytes=MAX_MANIFEST_BYTES,
                    )
                    break
                except (BlobUnavailable, ManifestMismatch) as e:
                    last = str(e)
            if time.monotonic() > deadline:
                raise DataUnavailable(f"could not get the task's shard list: {last}")
            time.sleep(1.0)
        write_manifest(self.directory, self.manifest, data)
        self._by_digest = {e.digest: e for e in self.manifest.shards}
        self._train = {e.index: e for e in self.manifest.split("train")}
        self._server = ShardServer(self.endpoint, self._held_path, handler=shard_handler(self.task.task_id))
        self._manifest_server = BlobServer(self.endpoint, manifest_handler(self.task.task_id))
        self._manifest_server.put(data.root, manifest_bytes(self.manifest))
        self.downloader = ShardDownloader(
            self.endpoint, self.cache, self.sources_for, parallel=2, handler=shard_handler(self.task.task_id)
        )
        held = sum(1 for d in self.cache.digests() if d in self._by_digest)
        self._prefetch_share()
        logger.info(
            f"data: {data.kind} ({data.layout}), {data.train_samples} training samples in "
            f"{len(self._train)} shards, {data.bytes / 1e6:.1f} MB in all; {held} shard(s) already cached"
        )
        return self.manifest

    def _prefetch_share(self) -> None:
        """Start downloading the first shards of this peer's share at once, while the rest of the
        start-up runs (state download, announcement): the share of the round the swarm computes now,
        among the peers that report progress. Only the first :data:`PREFETCH_AT_START`: peers that
        start together see nobody else yet and would take everything for their share. The shards a
        peer scores highest on come first, and those are the likeliest to stay its own once the
        roster is known."""
        try:
            records = self.board.read()
        except Exception as e:  # the DHT may fail a read: the first round asks for the share anyway
            logger.debug(f"could not read the swarm's progress: {e}")
            records = []
        swarm_round = max((r.round for r in records), default=0)
        current, _ = self.share(swarm_round, [r.peer_id for r in records])
        self._pin([e.digest for e in current[:PREFETCH_AT_START]])
        self.downloader.want(current[:PREFETCH_AT_START])

    def _held_path(self, digest: str) -> Path | None:
        # serving a shard to others does not make it recently used here
        return self.cache.path(digest, touch=False) if digest in self._by_digest else None

    # ------------------------------------------------------------------ who holds what

    def _holders_of(self, index: int | None) -> list[str]:
        """Peers whose progress record says they hold shard ``index`` (None: any shard), re-read at
        most every :data:`HOLDERS_READ_EVERY` s; never this peer."""
        with self._holders_lock:
            if time.monotonic() - self._holders_read_at >= HOLDERS_READ_EVERY:
                self._holders_read_at = time.monotonic()
                holders: dict[int, list[str]] = {}
                try:
                    records = self.board.read()
                except Exception as e:  # the DHT may fail a read: the aggregator still serves
                    logger.debug(f"could not read shard holders: {e}")
                    records = []
                for record in records:
                    if record.peer_id == self.peer_id or not record.shards_held:
                        continue
                    for held in held_shards(record.shards_held):
                        holders.setdefault(held, []).append(record.peer_id)
                self._holders = holders
            if index is None:
                return sorted({p for peers in self._holders.values() for p in peers})
            return list(self._holders.get(index, []))

    def sources_for(self, entry: ShardEntry) -> list[str]:
        """Where shard ``entry`` can be fetched: the peers that hold it, then the aggregators."""
        peers = self._holders_of(entry.index)
        return [*peers, *(a for a in self.aggregators() if a not in peers)]

    def holdings(self) -> tuple[str, int, int]:
        """(bitmap of shards held, shard bytes served, shard bytes fetched), for the progress record."""
        if self.manifest is None:
            return "", 0, 0
        held = [self._by_digest[d].index for d in self.cache.digests() if d in self._by_digest]
        served = self._server.bytes_served if self._server is not None else 0
        fetched = self.downloader.progress().bytes_done if self.downloader is not None else 0
        return holdings_bitmap(held), served, fetched

    # ------------------------------------------------------------------ each round

    def share(
        self, round_index: int, roster: Sequence[str]
    ) -> tuple[tuple[ShardEntry, ...], tuple[ShardEntry, ...]]:
        """This peer's shards in the epoch of ``round_index``, and in the next one once the epoch's
        last quarter began (empty before: fetched earlier, they would only sit on disk), each cut to
        half the cache (the other half holds the next epoch's while this one's are in use)."""
        data, params = self.task.data, self.task.params
        if self.whole_dataset:
            everything = tuple(self._train[i] for i in sorted(self._train))
            return everything, ()
        per_epoch = rounds_per_epoch(data.train_samples, params.target_samples_per_round)
        epoch, position = divmod(round_index, per_epoch)
        indices = sorted(self._train)

        def of(e: int) -> tuple[ShardEntry, ...]:
            mine = assigned_shards(indices, self.task.seed, e, roster, self.peer_id)
            return within_budget([self._train[i] for i in mine], self.cache_bytes // 2)

        prefetch = position >= per_epoch - max(1, per_epoch // 4)
        return of(epoch), of(epoch + 1) if prefetch else ()

    def shards_for_round(
        self, round_index: int, roster: Sequence[str], stop: threading.Event
    ) -> tuple[int, ...]:
        """The training shards (manifest indices, sorted) this peer's workers draw from in
        ``round_index``: those of its share already on disk, after waiting (bounded) for the first.
        Queues the rest of its share, then the next epoch's, for download. Raises DataUnavailable."""
        current, upcoming = self.share(round_index, roster)
        self._pin([e.digest for e in (*current, *upcoming)])
        # a share that shrank as the roster grew (the validation shards stay, once a search asked)
        self.downloader.retain([*current, *upcoming, *self._validation_entries])
        self.downloader.want(current)
        self.downloader.want(upcoming)
        started, logged = time.monotonic(), time.monotonic()
        while True:
            held = [e for e in current if self.cache.has(e.digest)]
            if held:
                if self.first_step_seconds is None:
                    self.first_step_seconds = time.monotonic() - self.started
                    logger.info(
                        f"data: first training step {self.first_step_seconds:.1f} s after the peer started "
                        f"({len(held)} of its {len(current)} shard(s) on disk)"
                    )
                return tuple(sorted(e.index for e in held))
            progress = self.downloader.progress()
            self.display.downloading(
                f"round {round_index + 1}", progress.shards_done, progress.shards_wanted,
                progress.bytes_done, progress.bytes_wanted,
            )  # fmt: skip
            if time.monotonic() - logged > LOG_EVERY:
                logged = time.monotonic()
                logger.info(
                    f"data: waiting for the first of {len(current)} shard(s): {progress.bytes_done / 1e6:.1f} of "
                    f"{progress.bytes_wanted / 1e6:.1f} MB{'; ' + progress.last_error if progress.last_error else ''}"
                )
            if stop.is_set():
                raise DataUnavailable("stopped while waiting for data")
            if time.monotonic() - started > FIRST_SHARD_SECONDS:
                raise DataUnavailable(
                    f"no shard of this peer's share arrived in {FIRST_SHARD_SECONDS:.0f} s "
                    f"({progress.last_error or 'no source answered'})"
                )
            self.downloader.wait(current[:1], timeout=0.25)

    def _pin(self, share: list[str]) -> None:
        """Keep the share's shards (and the validation shards, once a search asked for them)."""
        with self._pins_lock:
            self._share_pins = share
            self.cache.pin([*share, *self._validation_pins])

    def validation_task(self, timeout: float = 300.0):
        """The task reading the validation split, its shards fetched first (the aggregator's
        search asks peers to evaluate sub-networks on it); DataUnavailable if they do not arrive."""
        val = self.manifest.split("val")
        with self._pins_lock:
            self._validation_entries = val
            self._validation_pins = [e.digest for e in val]
            self.cache.pin([*self._share_pins, *self._validation_pins])
        self.downloader.want(val)
        if not self.downloader.wait(val, timeout=timeout):
            raise DataUnavailable(f"the validation shards did not arrive in {timeout:.0f} s")
        return local_shard_task(self.task.data, self.directory)[0]

    def close(self) -> None:
        if self.downloader is not None:
            progress = self.downloader.progress()
            self.downloader.close()
            served = self._server.bytes_served if self._server is not None else 0
            logger.info(
                f"data: fetched {progress.bytes_done} bytes in {progress.shards_done} shard(s) of a "
                f"{self.task.data.bytes}-byte dataset; served {served} bytes to others"
            )
        for server in (self._server, self._manifest_server):
            if server is not None:
                server.close()
