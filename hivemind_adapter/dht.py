"""The DHT as MANTA uses it: start a node, store a value under a key and subkey, and read every
signed record under a key — each read bounded, each record opened (checked) by the caller's opener.

Every node registers MANTA's validator, so forged records are dropped where they are stored; a
reader still opens every entry itself (a node without the validator, or its own cache, may hand back
anything), and skips what its opener rejects.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from multiprocessing.reduction import ForkingPickler
from typing import Any, TypeVar

import hivemind
import psutil
from hivemind.dht.node import DHTNode
from hivemind.p2p import P2P
from hivemind.utils import get_dht_time

from hivemind_adapter.control_traffic import install_control_counting
from hivemind_adapter.in_thread import ComponentEnded, ThreadHosted
from hivemind_adapter.p2p_sockets import daemon_socket_files, remove_dead_daemon_sockets, remove_dead_socket
from hivemind_adapter.process_answers import NoAnswerWithin, ProcessEnded, await_answer
from hivemind_adapter.process_identity import is_running, start_ticks
from hivemind_adapter.process_locks import install_death_safe_locks
from hivemind_adapter.store_search import ask_for_nodes_only, install_nodes_only_store_search
from hivemind_adapter.stream_openings import install_quiet_stream_openings
from hivemind_adapter.task_reports import quiet_expected_task_endings
from protocol.identity import Identity
from protocol.peer_keys import Libp2pKey, Speaker
from protocol.sealing import RecordRejected

T = TypeVar("T")
READ_TIMEOUT = 10.0  # seconds for one DHT read: a dead bootstrap must cost this, never a hang
# A DHT's start: its daemon's (hivemind allows 15 s) and its bootstrap's, each bounded inside hivemind;
# two minutes is far past any start that will still succeed, even on a slow emulated link.
DHT_START_SECONDS = 120.0
DHT_SHUTDOWN_SECONDS = 3.0  # hivemind's grace for a node's shutdown, before it is ended the hard way
# Kademlia's k, which is also the beam of every lookup: hivemind's 20 made each read and store ask
# min(n, 20) nodes, each replying with the whole value (O(n^2) bytes per lookup below 21 peers). A
# value still goes to hivemind's 5 replicas, which a beam of 5 reaches; a read stores what it found
# on the nearest node that lacked it (hivemind's cache_nearest), so a joiner nearer a key gets a copy.
DHT_BUCKET_SIZE = 5
logger = logging.getLogger(__name__)


class SwarmUnreachable(RuntimeError):
    """The DHT node could not join the swarm; one line for the user."""


class _RequestPipe:
    """The DHT process's end of the pipe its callers send requests down, where a request that cannot
    be opened is dropped instead of ending the process.

    A request carries its caller's reply pipe, which the DHT's process fetches from the caller's own
    process as it unpickles the request. If that process died meanwhile (an averager killed just after
    it started), the fetch fails: hivemind's loop goes on after most such errors, but an EOFError (the
    caller died after reading the fetch's question, before answering it) would end the loop, and with
    it the DHT's process, hanging every later call on it. Nobody waits for the dropped request's
    answer: its caller is gone. A pipe that is itself closed (the DHT's parent is gone) still ends the
    loop."""

    def __init__(self, pipe):
        self._pipe = pipe

    def fileno(self) -> int:
        return self._pipe.fileno()

    def poll(self, timeout: float = 0.0) -> bool:
        return self._pipe.poll(timeout)

    def recv(self) -> tuple[str, list, dict]:
        message = self._pipe.recv_bytes()
        try:
            return ForkingPickler.loads(message)
        except (EOFError, OSError) as e:
            logger.warning("a DHT request was dropped: its sender is gone (%s: %s)", type(e).__name__, e)
            return "_dropped_request", [], {}

    def close(self) -> None:
        self._pipe.close()


class DHTStartFailed(RuntimeError):
    """A DHT's process ended, or did not get ready within its bound, while it started."""


class SwarmDHT(hivemind.DHT):
    """hivemind's DHT, whose process outlives a caller that died in the middle of a request, whose
    start is bounded, and which knows its daemon's socket file (to remove it if the process is killed).
    """

    daemon_socket: str | None = None  # the p2pd daemon's socket file, once started
    libp2p_key: Libp2pKey | None = None  # the key its peer id is made from (in the process that started it)
    daemon_process: tuple[int, int] | None = None  # the daemon's pid and start (start_ticks), once started

    def run(self) -> None:
        self._inner_pipe = _RequestPipe(self._inner_pipe)  # in the DHT's own process
        super().run()

    async def _dropped_request(self) -> None:
        return None

    def run_in_background(self, await_ready: bool = True, timeout: float | None = None) -> None:
        """hivemind waits for the DHT's process to get ready with no bound (a process killed while it
        starts, or one that cannot report, never answers); this waits ``timeout`` seconds (default
        :data:`DHT_START_SECONDS`) at most and fails at once if the process ended."""
        self.start()
        if not await_ready:
            return
        bound = DHT_START_SECONDS if timeout is None else timeout
        try:
            await_answer(self._ready, self, bound)  # raises the start's own error, if it failed
        except ProcessEnded as ended:
            raise DHTStartFailed(
                f"the DHT's process ended while starting (exit code {ended.exitcode})"
            ) from None
        except NoAnswerWithin:
            self.kill()
            self.join(10.0)
            raise DHTStartFailed(f"the DHT's process did not get ready within {bound:.0f} s") from None
        self.daemon_socket, self.daemon_process = self._own_daemon()

    def _own_daemon(self) -> tuple[str | None, tuple[int, int] | None]:
        """The socket file of the p2pd daemon this DHT started, and the daemon's pid and start time."""
        return _daemon_of(self.pid)

    def shutdown(self) -> None:
        super().shutdown()
        if self._parent_pid == os.getpid():  # only the process that started it knows it ended
            self.remove_daemon_socket()  # left by a process killed (or terminated) before this

    def remove_daemon_socket(self, patience: float = 5.0) -> bool:
        """After this DHT's process ended without shutting down (killed), stop its daemon if it still
        runs (orphaned, it served nobody until the process tree ended) and remove its socket file,
        which hivemind removes only in a shutdown its process carries out. True if the file is gone."""
        if self.daemon_socket is None or self.is_alive():
            return self.daemon_socket is None
        if self.daemon_process is not None:
            pid, started = self.daemon_process
            with contextlib.suppress(psutil.Error):
                daemon = psutil.Process(pid)
                if start_ticks(pid) == started:  # not a recycled pid
                    daemon.terminate()
                    _, alive = psutil.wait_procs([daemon], timeout=3.0)
                    for left in alive:
                        left.kill()
        return remove_dead_socket(self.daemon_socket, patience)


class InThreadDHT(ThreadHosted, SwarmDHT):
    """A :class:`SwarmDHT` served from a thread of the process that started it
    (:mod:`hivemind_adapter.in_thread`): no process of its own; its p2pd daemon is that process's
    child, and if the daemon ends, the DHT ends with it (exit code 1). Its shutdown first lets the
    stores in flight land (a peer's last report, posted without waiting, must not die with it)."""

    drain_seconds = 2.0

    def _thread_name(self) -> str:
        return "manta-dht"

    async def _serve(self) -> None:
        replica = await P2P.replicate(self._daemon_listen_maddr) if self._daemon_listen_maddr else None
        self._node = await DHTNode.create(
            initial_peers=self.initial_peers,
            num_workers=self.num_workers,
            record_validator=self._record_validator,
            p2p=replica,
            **self.kwargs,
        )
        daemon = getattr(self._node.p2p, "_child", None)
        if daemon is not None:  # the daemon is this node's link to the swarm: it ends with it
            self._host_tasks.add(asyncio.create_task(self._end_with(daemon)))

    async def _end_with(self, daemon) -> None:
        code = await daemon.wait()
        if not self._host_stopping and not getattr(self, "_host_killed", False):
            logger.warning("the DHT's p2pd daemon ended (exit code %s)", code)
            self._end_abruptly()

    def _forget(self) -> None:
        self._node = None

    async def _release(self) -> None:
        # the daemon's pipes are bound to this loop: close them before it closes (a killed DHT's
        # daemon, still running, goes with it, as a process's would be stopped at its shutdown)
        child = getattr(getattr(self._node, "p2p", None), "_child", None)
        if child is not None:
            child._transport.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(child.wait(), 5.0)

    def _own_daemon(self) -> tuple[str | None, tuple[int, int] | None]:
        p2p = self._node.p2p  # hivemind's own attributes: this module is their one reader
        child = getattr(p2p, "_child", None)
        if child is None:
            return None, None
        started = start_ticks(child.pid)
        if started is None:
            return None, None
        return str(p2p._daemon_listen_maddr)[len("/unix") :], (child.pid, started)


def _daemon_of(pid: int) -> tuple[str | None, tuple[int, int] | None]:
    """The unix socket of the p2pd daemon that process ``pid`` started, and the daemon's pid and start
    time (read from the daemon's command line: hivemind keeps the path inside the DHT's process)."""
    try:
        for child in psutil.Process(pid).children():
            for arg in child.cmdline():
                if arg.startswith("-listen=/unix/"):
                    started = start_ticks(child.pid)
                    return arg[len("-listen=/unix") :], (child.pid, started) if started is not None else None
    except psutil.Error:
        pass
    return None, None


def start_dht(
    *,
    initial_peers: Sequence[str] = (),
    host_maddrs: Sequence[str] = ("/ip4/0.0.0.0/tcp/0",),  # hivemind's default
    announce_maddrs: Sequence[str] | None = None,
    client_mode: bool = False,
    libp2p_key: Libp2pKey | None = None,
    validators: Sequence[Any] = (),
    in_thread: bool = True,
    bucket_size: int = DHT_BUCKET_SIZE,
    nodes_only_store_search: bool = True,
) -> hivemind.DHT:
    """A running DHT node and its p2pd daemon, whose peer id is made from ``libp2p_key`` (a fresh key
    if None; see :mod:`protocol.peer_keys`), served from a thread of this process (``in_thread``) or
    from a process of its own; ``bucket_size``: see :data:`DHT_BUCKET_SIZE`;
    ``nodes_only_store_search``: see :mod:`hivemind_adapter.store_search` (for this whole process).
    SwarmUnreachable if it cannot join."""
    _hivemind_logs_follow_manta()
    quiet_expected_task_endings()
    install_control_counting()  # before the node and any averager register their handlers
    install_nodes_only_store_search()
    ask_for_nodes_only(nodes_only_store_search)
    install_death_safe_locks()  # a node's first hivemind process is its DHT's: the tree shares them
    install_quiet_stream_openings()
    daemons_before = daemon_socket_files()
    key = libp2p_key if libp2p_key is not None else Libp2pKey.generate()
    key_folder = None
    if key.path is None:  # the daemon reads its key from a file: a private one, removed once it started
        key_folder = tempfile.mkdtemp(prefix="manta-libp2p-")
        key_file = os.path.join(key_folder, "libp2p.key")
        with open(os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as out:
            out.write(key.private_protobuf())
    else:
        key_file = str(key.path)
    try:
        dht = (InThreadDHT if in_thread else SwarmDHT)(
            initial_peers=list(initial_peers),
            host_maddrs=list(host_maddrs),
            announce_maddrs=list(announce_maddrs) if announce_maddrs else None,
            client_mode=client_mode,
            identity_path=key_file,
            check_if_identity_free=False,
            record_validators=list(validators),
            shutdown_timeout=DHT_SHUTDOWN_SECONDS + (InThreadDHT.drain_seconds if in_thread else 0.0),
            bucket_size=bucket_size,
            start=True,
        )
        dht.libp2p_key = key
        return dht
    except Exception as e:
        remove_dead_daemon_sockets(daemons_before)  # the daemon that gave up left its socket file
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if "initial_peers responded" in first or "failed to connect to bootstrap peers" in first:
            first = f"cannot reach any initial peer ({', '.join(initial_peers)})"
        raise SwarmUnreachable(first) from None
    finally:
        if key_folder is not None:
            shutil.rmtree(key_folder, ignore_errors=True)


def _hivemind_logs_follow_manta() -> None:
    """With ``MANTA_LOG_FORMAT=json`` (console/logs.py), hivemind's records go to the root logger and
    MANTA's JSON lines instead of hivemind's own handler, at the level hivemind was given."""
    if os.environ.get("MANTA_LOG_FORMAT", "").strip().lower() != "json":
        return
    from hivemind.utils import logging as hivemind_logging

    hivemind_logging.use_hivemind_log_handler("nowhere")
    logging.getLogger("hivemind").setLevel(hivemind_logging.loglevel)


def dht_gone(dht: hivemind.DHT) -> bool:
    """Whether ``dht``'s process (or thread) or its p2pd daemon has ended: then a call would only wait
    out its timeout. Known only in the process that started the DHT; an averager's process, which
    holds a copy, cannot tell (False there) and calls as usual."""
    if getattr(dht, "_parent_pid", None) != os.getpid():
        return False
    daemon = getattr(dht, "daemon_process", None)
    return not dht.is_alive() or (daemon is not None and not is_running(*daemon))


def peer_id(dht: hivemind.DHT) -> str:
    return dht.peer_id.to_base58()


def speaker(dht: hivemind.DHT, identity: Identity) -> Speaker:
    """What this node signs as: ``identity`` under the DHT's peer id, endorsed by its libp2p key
    (a DHT :func:`start_dht` started, in the process that started it)."""
    key = getattr(dht, "libp2p_key", None)
    if key is None:
        raise ValueError("this DHT was not started by start_dht: its libp2p key is unknown")
    return Speaker.of(identity, key)


def visible_maddrs(dht: hivemind.DHT) -> list[str]:
    return [str(m) for m in dht.get_visible_maddrs()]


def dht_time() -> float:
    """The DHT's clock (expirations are in it)."""
    return get_dht_time()


def store(
    dht: hivemind.DHT,
    key: str,
    value: Any,
    ttl: float,
    subkey: str | None = None,
    timeout: float = READ_TIMEOUT,
    wait: bool = True,
) -> bool:
    """Store ``value`` for ``ttl`` seconds; False if no node took it within ``timeout``. ``wait=False``:
    return True at once while the DHT's process stores it."""
    if dht_gone(dht):
        return False
    try:
        future = dht.store(key, value, get_dht_time() + ttl, subkey=subkey, return_future=True)
        if not wait:
            return True
        return bool(future.result(timeout=timeout))
    except (TimeoutError, ComponentEnded):  # not stored in time, or the DHT ended meanwhile
        return False


def read_entries(dht: hivemind.DHT, key: str, timeout: float = READ_TIMEOUT) -> dict[str, Any]:
    """subkey -> raw value of every entry under ``key``; {} if none, or none arrived within ``timeout``."""
    return read_entries_of_keys(dht, [key], timeout)[0]


def read_entries_of_keys(
    dht: hivemind.DHT, keys: Sequence[str], timeout: float = READ_TIMEOUT
) -> list[dict[str, Any]]:
    """:func:`read_entries` of each of ``keys``, the lookups in flight together (one ``timeout`` for
    all; a key whose lookup has not finished by then reads as {})."""
    return [
        {sub: value for sub, (value, _expires) in found.items()}
        for found in read_expiring_entries_of_keys(dht, keys, timeout)
    ]


def read_expiring_entries(
    dht: hivemind.DHT, key: str, timeout: float = READ_TIMEOUT
) -> dict[str, tuple[Any, float]]:
    """subkey -> (raw value, the DHT time it expires at) of every entry under ``key``, as
    :func:`read_entries`."""
    return read_expiring_entries_of_keys(dht, [key], timeout)[0]


def read_expiring_entries_of_keys(
    dht: hivemind.DHT, keys: Sequence[str], timeout: float = READ_TIMEOUT
) -> list[dict[str, tuple[Any, float]]]:
    """:func:`read_expiring_entries` of each of ``keys``, as :func:`read_entries_of_keys`."""
    if dht_gone(dht):
        return [{} for _ in keys]
    try:
        futures = [dht.get(key, latest=True, return_future=True) for key in keys]
    except ComponentEnded:  # it ended meanwhile
        return [{} for _ in keys]
    deadline = time.monotonic() + timeout
    out = []
    for future in futures:
        try:
            found = future.result(timeout=max(0.0, deadline - time.monotonic()))
        except (TimeoutError, ComponentEnded):
            found = None
        if found is None or not isinstance(found.value, dict):
            out.append({})
        else:
            out.append({str(sub): (item.value, item.expiration_time) for sub, item in found.value.items()})
    return out


def read_signed(
    dht: hivemind.DHT, key: str, opener: Callable[[str, Any], T], timeout: float = READ_TIMEOUT
) -> list[T]:
    """``opener(subkey, value)`` of every entry under ``key``; entries it rejects are skipped."""
    out = []
    for sub, value in read_entries(dht, key, timeout).items():
        try:
            out.append(opener(sub, value))
        except RecordRejected:
            continue
    return out


async def _validator_counts(_dht: hivemind.DHT, node: Any) -> tuple[int, int]:
    """Runs in the DHT process, where hivemind validates what the node stores and receives."""
    checked = cached = 0
    for validator in getattr(node.protocol.record_validator, "_validators", ()):
        counts = getattr(validator, "counts", None)
        if isinstance(counts, tuple):
            checked, cached = checked + counts[0], cached + counts[1]
    return checked, cached


async def _validator_rejections(_dht: hivemind.DHT, node: Any) -> dict[str, int]:
    """Runs in the DHT process: the validators' refusals, summed over those that count them."""
    out: dict[str, int] = {}
    for validator in getattr(node.protocol.record_validator, "_validators", ()):
        rejected = getattr(validator, "rejected", None)
        if isinstance(rejected, dict):
            for label, count in rejected.items():
                out[label] = out.get(label, 0) + count
    return out


def record_validator_rejections(dht: hivemind.DHT, timeout: float = READ_TIMEOUT) -> dict[str, int]:
    """What the validators of ``dht``'s own process refused so far, by ``"<key name>:<reason>"``
    (MANTA's :class:`protocol.dht_schema.MantaRecordValidator`): the forgeries it kept out."""
    return dht.run_coroutine(_validator_rejections, return_future=True).result(timeout=timeout)


def record_validator_counts(dht: hivemind.DHT, timeout: float = READ_TIMEOUT) -> tuple[int, int]:
    """(entries checked, entries answered from a verdict cache) by the validators of ``dht``'s own
    process that count them (MANTA's): what validating the records it handled has cost so far."""
    return dht.run_coroutine(_validator_counts, return_future=True).result(timeout=timeout)
