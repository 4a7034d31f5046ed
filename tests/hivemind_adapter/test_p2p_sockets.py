"""No socket file is left in /tmp: an averager's, whether it was shut down or killed, nor any of a
peer's tree killed with SIGKILL (hivemind never removes the p2p client socket an averager opens, and
a killed tree removes nothing: thousands piled up in /tmp)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time

import psutil
import torch

from hivemind_adapter.allreduce import VerifiedAverager
from hivemind_adapter.dht import read_entries, start_dht, store
from hivemind_adapter.p2p_sockets import daemon_socket_files, remove_dead_daemon_sockets
from hivemind_adapter.reaper import remove_files

LOOPBACK = ["/ip4/127.0.0.1/tcp/0"]


def _socket_file(averager) -> str:
    path = averager.socket_path
    assert path.startswith("/tmp/hivemind-p2pclient-") and os.path.exists(path), path
    return path


def test_an_averager_shut_down_removes_its_socket_file():
    dht = start_dht(host_maddrs=LOOPBACK)
    try:
        averager = VerifiedAverager([torch.zeros(4)], dht, prefix="sockets", start=True)
        other = VerifiedAverager([torch.zeros(4)], dht, prefix="sockets-2", start=True)
        paths = [_socket_file(averager), _socket_file(other)]
        assert paths[0] != paths[1]
        averager.shutdown()
        other.shutdown()
        assert not any(os.path.exists(p) for p in paths)
    finally:
        dht.shutdown()


def test_a_killed_averager_s_socket_file_is_removed_and_its_dht_outlives_it():
    """Killed (its served side ended at once, nothing shut down), an averager still leaves no socket
    file, and the DHT it used goes on serving."""
    dht = start_dht(host_maddrs=LOOPBACK)
    try:
        averager = VerifiedAverager([torch.zeros(4)], dht, prefix="killed", start=True)
        path = _socket_file(averager)
        averager.kill()
        averager.join(10)
        assert not averager.is_alive() and averager.exitcode == 1
        averager.shutdown()
        assert not os.path.exists(path)
        assert dht.is_alive()
        assert store(dht, "after", 1, 60.0, subkey="a", timeout=10.0)
        assert read_entries(dht, "after", timeout=10.0) == {"a": 1}
    finally:
        dht.shutdown()


def test_the_reaper_leaves_a_listener_the_tree_only_inherited_a_connection_of():
    """A process forked while its parent's resource sharer served a connection holds that accepted
    socket, which carries the parent's listener's path. Killed, its tree's reaper must not take the
    parent's listener with it (in CI it did, and the test harness's own DHT calls hung)."""
    folder = tempfile.mkdtemp(prefix="pymp-outside-")
    listener_path = os.path.join(folder, "listener-outside")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(listener_path)
        listener.listen()
        client.connect(listener_path)
        accepted, _ = listener.accept()
        code = "from hivemind_adapter.runtime import start_orphan_reaper; import time; start_orphan_reaper(); time.sleep(60)"
        child = subprocess.Popen([sys.executable, "-c", code], pass_fds=[accepted.fileno()], cwd=os.getcwd())
        accepted.close()  # only the child holds it now, as a forked child would
        try:
            deadline = time.monotonic() + 30
            reaper = []
            while not reaper and time.monotonic() < deadline:
                reaper = psutil.Process(child.pid).children()
                time.sleep(0.1)
            assert reaper, "the child started no reaper"
            held = {c.laddr for c in psutil.Process(child.pid).net_connections(kind="unix")}
            assert listener_path in held, held  # what the reaper reads as one of the tree's listeners
            time.sleep(1.5)  # the reaper reads the tree's sockets once a second
            os.kill(child.pid, signal.SIGKILL)
            child.wait(timeout=10)
            psutil.wait_procs(reaper, timeout=15)
        finally:
            if child.poll() is None:
                child.kill()
        assert not any(p.is_running() for p in reaper), "the reaper did not finish"
        assert os.path.exists(listener_path)
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        probe.connect(listener_path)  # still the parent's, still answering
        probe.close()
    finally:
        client.close()
        listener.close()
        shutil.rmtree(folder, ignore_errors=True)


def test_a_killed_peer_s_whole_tree_leaves_no_socket_file(tmp_path):
    """The orphan reaper removes what a SIGKILLed process tree listened on: the DHT's daemon socket
    and the averager's client socket."""
    listing = tmp_path / "sockets"
    code = textwrap.dedent(f"""
        import time, torch
        from hivemind_adapter.runtime import prepare_process, start_orphan_reaper
        prepare_process()
        start_orphan_reaper()
        from hivemind_adapter.allreduce import VerifiedAverager
        from hivemind_adapter.dht import read_entries, start_dht, store
        from hivemind_adapter.p2p import _daemon_address
        dht = start_dht(host_maddrs={LOOPBACK!r})
        averager = VerifiedAverager([torch.zeros(4)], dht, prefix="tree", start=True)
        daemon = dht.run_coroutine(_daemon_address)["unix"]
        open({str(listing)!r} + ".part", "w").write(daemon + "\\n" + averager.socket_path)
        import os; os.rename({str(listing)!r} + ".part", {str(listing)!r})
        time.sleep(120)
    """)
    peer = subprocess.Popen([sys.executable, "-c", code], cwd=os.getcwd())
    try:
        deadline = time.monotonic() + 60
        while not listing.exists() and time.monotonic() < deadline and peer.poll() is None:
            time.sleep(0.05)
        paths = listing.read_text().split("\n")
        assert len(paths) == 2 and all(os.path.exists(p) for p in paths), paths
        tree = [psutil.Process(peer.pid), *psutil.Process(peer.pid).children(recursive=True)]
        listeners = {
            c.laddr
            for proc in tree
            for c in proc.net_connections(kind="unix")
            if isinstance(c.laddr, str) and os.path.basename(os.path.dirname(c.laddr)).startswith("pymp-")
        }
        # the DHT and the averager are served from the peer's own threads: no pipe is passed between
        # processes, so nothing listens in multiprocessing's folder
        assert not listeners, listeners
        time.sleep(1.5)  # the reaper reads the tree's sockets once a second
        os.kill(peer.pid, signal.SIGKILL)
        peer.wait(timeout=10)
        deadline = time.monotonic() + 15
        while any(os.path.exists(p) for p in paths) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(os.path.exists(p) for p in paths), [p for p in paths if os.path.exists(p)]
    finally:
        if peer.poll() is None:
            peer.kill()


def test_a_daemon_gone_before_its_killed_peer_leaves_no_socket_file(tmp_path):
    """p2pd exits by itself within half a second of its peer's kill -9, leaving its socket file; the
    reaper may not have read its open files by then (under load). A daemon's socket is known from its
    command line: here a stand-in exits just after it listened, and its peer is killed at once."""
    path = os.path.join(tempfile.gettempdir(), f"hivemind-p2pd-reaper-test-{os.getpid()}.sock")
    daemon = textwrap.dedent(f"""
        import os, socket, time
        time.sleep(2.0)  # long after the reaper first read the tree
        socket.socket(socket.AF_UNIX).bind({path!r})
        os._exit(0)  # as a killed daemon: its socket file stays
    """)
    peer_code = textwrap.dedent(f"""
        import subprocess, sys, time
        from hivemind_adapter.runtime import start_orphan_reaper
        start_orphan_reaper()
        subprocess.Popen([sys.executable, "-c", {daemon!r}, "-listen=/unix{path}"])
        time.sleep(60)
    """)
    peer = subprocess.Popen([sys.executable, "-c", peer_code], cwd=os.getcwd())
    try:
        deadline = time.monotonic() + 30
        while not os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.005)
        assert os.path.exists(path), "the stand-in daemon never listened"
        os.kill(peer.pid, signal.SIGKILL)
        peer.wait(timeout=10)
        deadline = time.monotonic() + 15
        while os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not os.path.exists(path), "the daemon's socket file was left"
    finally:
        if peer.poll() is None:
            peer.kill()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def test_the_reaper_removes_a_multiprocessing_folder_once_empty_unless_the_watched_process_had_it(tmp_path):
    """A ``pymp-*`` folder the tree made goes with its listeners; one the watched process already had
    when it started the watcher may be its parent's (shared at fork) and stays, as does one that
    still holds a listener the tree did not own."""
    made, inherited, shared = (tmp_path / name for name in ("pymp-made", "pymp-inherited", "pymp-shared"))
    listeners = set()
    for folder in (made, inherited, shared):
        folder.mkdir()
        listeners.add(folder / "listener-tree")
        (folder / "listener-tree").touch()
    (shared / "listener-someone-else").touch()
    remove_files(listeners, kept_folder=str(inherited))
    assert not any(path.exists() for path in listeners)
    assert not made.exists()
    assert inherited.is_dir() and shared.is_dir()


def test_a_daemon_socket_file_left_by_a_daemon_that_gave_up_is_removed_and_a_live_ones_kept():
    """What start_dht does after a DHT failed to start: new daemon socket files that refuse a
    connection go; one that listens (another process's daemon, started meanwhile) stays, as does
    any file that was there before, and one just bound whose daemon does not listen yet (removed,
    that daemon was never reached: a DHT start in another test failed so)."""
    tag = f"{os.getpid()}-{time.monotonic_ns()}"
    names = ("older", "dead", "live", "starting")
    older, dead, live, starting = (f"/tmp/hivemind-p2pd-test-{name}-{tag}.sock" for name in names)
    sockets = []
    try:
        for path in (older, dead, live, starting):
            if path == dead:
                before = daemon_socket_files()  # as start_dht takes it, before the DHT starts
            server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            server.bind(path)
            if path != starting:
                server.listen()
            sockets.append(server)
        sockets[0].close()  # a stale file from before: not this call's to judge
        sockets[1].close()  # its daemon is gone: the file stays, refusing connections
        long_ago = time.time() - 10.0
        os.utime(dead, (long_ago, long_ago))  # its daemon gave up after trying for a while
        assert remove_dead_daemon_sockets(before, patience=0.3) == [dead]
        assert not os.path.exists(dead)
        assert os.path.exists(live) and os.path.exists(older) and os.path.exists(starting)
    finally:
        for server in sockets:
            server.close()
        for path in (older, dead, live, starting):
            if os.path.exists(path):
                os.remove(path)
