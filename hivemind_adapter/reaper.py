"""A watcher that stops a process's whole tree when that process dies, even by SIGKILL.

hivemind starts a DHT process, averager processes and a Go ``p2pd`` daemon under a peer; if the peer
is killed, they are re-parented to init and run on (measured: still alive 40 s later). A parent-death
signal only reaches direct children, and the peer cannot use its own process group without leaving
the terminal's foreground group (Ctrl-C would no longer reach it). So a tiny watcher child keeps a
fresh snapshot of the watched process's descendants and, once that process is gone, kills every
process of the last snapshot (checking each one's start time, so a recycled pid is never hit).

Run as ``python -m hivemind_adapter.reaper PID``; :func:`hivemind_adapter.runtime.start_orphan_reaper` does that.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import psutil


def _snapshot(watched: psutil.Process) -> dict[int, float]:
    try:
        procs = watched.children(recursive=True)
    except psutil.NoSuchProcess:
        return {}
    out = {}
    for p in procs:
        if p.pid == os.getpid():
            continue
        try:
            out[p.pid] = p.create_time()
        except psutil.NoSuchProcess:
            pass
    return out


def watch(pid: int, interval: float = 0.25) -> int:
    """Block until ``pid`` exits, then kill its last known descendants. Returns how many were killed."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the watched process, not for us
    try:
        watched = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return 0
    known: dict[int, float] = {}
    while True:
        try:
            alive = watched.is_running() and watched.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            alive = False
        if not alive:
            break
        known.update(_snapshot(watched))
        known = {p: t for p, t in known.items() if psutil.pid_exists(p)}
        time.sleep(interval)
    victims = []
    for p, created in known.items():
        try:
            proc = psutil.Process(p)
            if abs(proc.create_time() - created) < 1e-3:
                victims.append(proc)
        except psutil.NoSuchProcess:
            pass
    for proc in victims:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(victims, timeout=5)
    return len(victims)


if __name__ == "__main__":
    sys.exit(0 if watch(int(sys.argv[1])) >= 0 else 1)
