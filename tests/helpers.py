"""Small helpers shared by tests."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest

# The emulated internet (testbed.wan) builds network namespaces, shapes links with tc and NATs with
# iptables: without root or those tools its tests cannot run here (`make test` installs iptables; CI
# runs as root).
needs_emulated_internet = pytest.mark.skipif(
    os.geteuid() != 0 or not all(shutil.which(t) for t in ("ip", "tc", "iptables")),
    reason="the emulated internet needs root, iproute2 and iptables (make test installs iptables)",
)


def console_script(name: str) -> str:
    """Path of an installed MANTA console script: beside this interpreter (the project's .venv), else on PATH."""
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return str(beside)
    found = shutil.which(name)
    if not found:
        raise FileNotFoundError(f"{name} is not installed (run `make venv`)")
    return found


def modules_loaded_by(code: str, modules: tuple[str, ...]) -> list[str]:
    """Which of ``modules`` a fresh interpreter has imported after running ``code``: what a process
    that does only that pays for at start."""
    probe = f"{code}\nimport sys\nprint(','.join(m for m in {modules!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return [m for m in out.stdout.strip().split(",") if m]


def processes_mentioning(path: Path) -> list[psutil.Process]:
    """Live processes whose command line mentions ``path`` (a run's files): must be none after a run."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if any(str(path) in part for part in proc.info["cmdline"] or []):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def socket_files() -> set[str]:
    """The unix socket files in /tmp that hivemind (daemon, clients) and multiprocessing (listeners)
    create: a run whose processes all shut down properly leaves none of its own behind."""
    return {
        str(path)
        for pattern in ("hivemind-p2p*.sock", "pymp-*/listener-*")
        for path in Path(tempfile.gettempdir()).glob(pattern)
    }


def wait_for_a_quiet_machine(timeout: float = 30.0, busy_percent: float = 20.0) -> str:
    """Wait (at most ``timeout`` s) until the whole machine's CPU is below ``busy_percent`` over one
    second, for a test that measures rates or round trips: its relays are Python processes that
    fall short of a link's rate when something else holds the cores (a 50mbit downlink read 41.9
    once in a full suite, and full rate alone). Returns what it saw, for the test's failure message:
    the last reading, and the busiest processes if the machine never quieted."""
    deadline = time.monotonic() + timeout
    while True:
        busy = psutil.cpu_percent(interval=1.0)
        if busy < busy_percent:
            return f"machine {busy:.0f} % busy before measuring"
        if time.monotonic() > deadline:
            break
    procs = list(psutil.process_iter(["name", "pid"]))
    for proc in procs:
        try:
            proc.cpu_percent(None)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    time.sleep(1.0)
    usage = []
    for proc in procs:
        try:
            usage.append((proc.cpu_percent(None), f"{proc.info['name']}[{proc.info['pid']}]"))
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    top = ", ".join(f"{name} {cpu:.0f} %" for cpu, name in sorted(usage, reverse=True)[:3])
    return f"machine still {busy:.0f} % busy after {timeout:.0f} s (busiest: {top})"


def wait_until(predicate: Callable[[], object], timeout: float, what: str, poll: float = 0.5) -> None:
    """Poll ``predicate`` until it is true; an AssertionError naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(poll)


@contextmanager
def two_task_dhts(task_id: str) -> Iterator[tuple]:
    """Two real hivemind DHT nodes on 127.0.0.1, the second bootstrapped from the first, both checking
    MANTA's records of ``task_id`` as every MANTA node does; shut down on exit."""
    from hivemind_adapter.dht import start_dht, visible_maddrs
    from protocol.dht_schema import MantaRecordValidator

    loopback = ["/ip4/127.0.0.1/tcp/0"]
    first = start_dht(host_maddrs=loopback)
    second = start_dht(host_maddrs=loopback, initial_peers=visible_maddrs(first))
    try:
        for dht in (first, second):
            dht.add_validators([MantaRecordValidator(task_id)])
        yield first, second
    finally:
        second.shutdown()
        first.shutdown()


@contextmanager
def progress_readers(task_id: str) -> Iterator[list]:
    """A :class:`~peer.swarm_progress.SwarmProgress` of a fresh key on each of :func:`two_task_dhts`
    (batches of 16, one device, a round's target of 256 samples)."""
    from hivemind_adapter.dht import peer_id, speaker
    from peer.swarm_progress import SwarmProgress
    from peer.swarm_view import ProgressBoard
    from protocol.identity import Identity

    with two_task_dhts(task_id) as dhts:
        yield [
            SwarmProgress(ProgressBoard(d, task_id, speaker(d, Identity.generate())), peer_id(d), 16, 1, 256)
            for d in dhts
        ]


def announced_member(dht, aggregator, task_id: str):
    """An :class:`~peer.swarm_view.Announcer` of a fresh key on ``dht``, holding a certificate of
    ``aggregator`` for ``task_id``, that announced itself once (a CPU peer of one device)."""
    from hivemind_adapter.dht import peer_id, speaker
    from peer.swarm_view import Announcer
    from protocol.identity import Identity
    from protocol.records import Affinity, DeviceInfo
    from tests.protocol.factories import certificate_wire

    identity = Identity.generate()
    certificate = certificate_wire(identity, aggregator=aggregator, task_id=task_id, peer_id=peer_id(dht))
    devices = (DeviceInfo(kind="cpu", name="test cpu", memory_mb=1024),)
    affinity = Affinity(host_id="ab" * 8, network_id="cd" * 8)
    announcer = Announcer(
        dht, speaker(dht, identity), task_id, devices, affinity, "auto", lambda: certificate, 1.0
    )
    assert announcer.announce()
    return announcer


def wait_for_line(path: Path, needle: str, proc: subprocess.Popen, timeout: float) -> str:
    """The first line of ``path`` (a process's log) holding ``needle``, polled until ``timeout`` s;
    an AssertionError if ``proc`` exits first or the line never comes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in path.read_text().splitlines():
            if needle in line:
                return line
        assert proc.poll() is None, f"{path} exited: {path.read_text()[-3000:]}"
        time.sleep(0.3)
    raise AssertionError(f"no {needle!r} in {path} within {timeout:.0f} s: {path.read_text()[-3000:]}")


# MANTA's top-level packages (every folder of the repository that is one).
PROJECT_PACKAGES = sorted(p.parent.name for p in Path(__file__).resolve().parents[1].glob("*/__init__.py"))

# The first lines of a script for a clean interpreter (``python -I -c``): importing any of MANTA's
# packages fails there, so what the script loads must open with its own tool alone.
REFUSE_MANTA_IMPORTS = textwrap.dedent(
    f"""
    import sys, importlib.abc
    class NoManta(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in {set(PROJECT_PACKAGES)!r}:
                raise ImportError("MANTA is not installed here")
    sys.meta_path.insert(0, NoManta())
    """
)


def run_swarm_to_end(swarm, timeout: float = 600.0, **aggregator_options):
    """Start ``swarm``'s aggregator (``aggregator_options``: :meth:`LocalSwarm.start_aggregator`'s)
    and every peer, wait until each peer has run its rounds (a peer that fails: its log's tail), and
    stop everything. Returns ``swarm``."""
    try:
        swarm.start_aggregator(**aggregator_options)
        for i in range(swarm.o.peers):
            swarm.start_peer(i)
        for i in range(swarm.o.peers):
            log = swarm.peer_dir(i) / "log.txt"
            assert swarm.procs[f"peer-{i}"].wait(timeout=timeout) == 0, log.read_text()[-3000:]
    finally:
        swarm.close()
    return swarm
