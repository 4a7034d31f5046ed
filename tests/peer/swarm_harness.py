"""Real multi-process swarms for tests: every peer is its own OS process with its own DHT node and
p2pd daemon on 127.0.0.1, exactly as separate machines would run them."""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import time
import traceback
from collections.abc import Callable
from typing import Any

import hivemind
import torch

from hivemind_adapter.dht import start_dht
from hivemind_adapter.p2p_sockets import remove_dead_socket
from hivemind_adapter.runtime import start_orphan_reaper
from testbed.peer_logs import log_to_file
from tests.helpers import socket_files

LOOPBACK = ["/ip4/127.0.0.1/tcp/0"]


def start_bootstrap_dht() -> tuple[hivemind.DHT, list[str]]:
    dht = start_dht(host_maddrs=LOOPBACK)
    return dht, [str(m) for m in dht.get_visible_maddrs()]


def _child(target: Callable, initial_peers: list[str], args: dict, results: mp.Queue, name: str) -> None:
    # A forked child must not enter an OpenMP parallel region: if the parent ever ran one (any large
    # torch op in an earlier test), the child inherits a thread pool whose threads did not survive
    # the fork, and its first parallel op hangs. Seen as "the victim never reached round 0" when
    # tests/hivemind_adapter ran first. One thread is what the peers of a real swarm get here anyway.
    torch.set_num_threads(1)
    dht = None
    start_orphan_reaper()  # as a real peer does: if this process is killed, its DHT and p2pd die with it
    if log_dir := os.environ.get("MANTA_TEST_PEER_LOGS"):
        log_to_file(os.path.join(log_dir, f"{name}.log"))
    try:
        dht = start_dht(initial_peers=initial_peers, host_maddrs=LOOPBACK)  # as a real peer starts it
        results.put((name, "ok", target(dht, **args)))
    except BaseException as e:  # report, never hang the parent waiting on the queue
        results.put((name, "error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
    finally:
        if dht is not None:
            dht.shutdown()


def run_peers(
    target: Callable[..., Any],
    initial_peers: list[str],
    peer_args: dict[str, dict],
    timeout: float = 180.0,
    on_started: Callable[[dict[str, mp.Process]], None] | None = None,
) -> dict[str, Any]:
    """Run ``target(dht, **args)`` in one forked process per peer; return {name: result}.

    ``on_started`` may act on the running processes (e.g. kill one); a peer that dies without
    reporting maps to None.
    """
    ctx = mp.get_context("fork")
    sockets_before = socket_files()
    results: mp.Queue = ctx.Queue()
    procs = {
        name: ctx.Process(target=_child, args=(target, initial_peers, a, results, name), daemon=False)
        for name, a in peer_args.items()
    }
    for p in procs.values():
        p.start()
    if on_started is not None:
        on_started(procs)
    out: dict[str, Any] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(out) < len(procs):
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"peers {sorted(set(procs) - set(out))} did not finish within {timeout}s"
                )
            try:
                name, status, value = results.get(timeout=0.5)
            except queue.Empty:
                if all(not p.is_alive() for p in procs.values()):
                    break  # everyone exited; a killed peer never reports
                continue
            if status == "error":
                raise AssertionError(f"peer {name} failed:\n{value}")
            out[name] = value
    finally:
        for p in procs.values():
            p.join(timeout=15)
            if p.is_alive():
                p.kill()
                p.join(5)
        # A peer killed on purpose can leave a hivemind socket file its reaper had not yet seen bound
        # (one made just before the kill): any new one nobody listens on any more is removed.
        for path in socket_files() - sockets_before:
            if "hivemind-p2p" in path:
                remove_dead_socket(path, patience=0.0)  # one look: a living one belongs to someone
    for name in procs:
        out.setdefault(name, None)
    return out


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
