"""The join line the aggregator prints runs as printed: every address, one flag each, and its key."""

from __future__ import annotations

import contextlib
import os
import secrets
import shlex
import signal
import subprocess
import time
from pathlib import Path

import pytest

from aggregator.join_line import join_command
from peer.cli import join as join_cli
from protocol.identity import Identity, fingerprint
from testbed.wan.netns import PREFIX, delete_namespaces, in_namespace, ip
from tests.helpers import console_script, needs_emulated_internet

KEY = "ab" * 32
PEER_ID = "QmSBUfPjhdbT5M2uQ6xHzpfukzPy4zLikVL22vxNhiqVzx"


def _parsed(line: str) -> dict:
    """What the real `manta-peer join` parser makes of the line (nothing runs)."""
    argv = shlex.split(line)
    assert argv[:2] == ["manta-peer", "join"], argv
    return join_cli.make_context("join", argv[2:]).params


def test_every_address_gets_its_own_flag_and_the_line_parses():
    maddrs = [
        f"/ip4/127.0.0.1/tcp/4000/p2p/{PEER_ID}",
        f"/ip4/10.0.0.2/tcp/4000/p2p/{PEER_ID}",
        f"/ip6/::1/tcp/4000/p2p/{PEER_ID}",
        f"/ip4/10.0.0.2/tcp/4000/p2p/{PEER_ID}",
        f"/ip4/192.168.1.7/tcp/4000/p2p/{PEER_ID}",
    ]
    params = _parsed(join_command("digits", maddrs, KEY))
    assert params["task_id"] == "digits"
    assert params["aggregator_key"] == KEY
    # other hosts' addresses first, in the node's order; loopback last; each once
    assert params["initial_peers"] == (
        f"/ip4/10.0.0.2/tcp/4000/p2p/{PEER_ID}",
        f"/ip4/192.168.1.7/tcp/4000/p2p/{PEER_ID}",
        f"/ip4/127.0.0.1/tcp/4000/p2p/{PEER_ID}",
        f"/ip6/::1/tcp/4000/p2p/{PEER_ID}",
    )


def test_a_task_id_with_shell_characters_is_quoted():
    params = _parsed(join_command("it's; rm -rf x", [f"/ip4/10.0.0.2/tcp/1/p2p/{PEER_ID}"], KEY))
    assert params["task_id"] == "it's; rm -rf x"


def test_no_address_is_an_error():
    with pytest.raises(ValueError, match="no address"):
        join_command("digits", [], KEY)


def test_a_malformed_aggregator_key_is_one_line_before_any_file_is_made(tmp_path):
    done = subprocess.run(
        [console_script("manta-peer"), "join", "--initial-peers", f"/ip4/10.0.0.2/tcp/1/p2p/{PEER_ID}",
         "--aggregator-key", "zz", "--identity", str(tmp_path / "id.key"), "--data-dir", str(tmp_path / "d")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == [
        "Error: --aggregator-key must be a 64-digit hex public key, got 'zz'"
    ]
    assert list(tmp_path.iterdir()) == []


@contextlib.contextmanager
def _multi_homed_host():
    """A network namespace with loopback and two more interfaces (10.77.0.2 and 10.78.0.2)."""
    ns = f"{PREFIX}join-{secrets.token_hex(3)}"
    try:
        ip(None, "netns", "add", ns)
        ip(ns, "link", "set", "lo", "up")
        for i, net in enumerate(("10.77.0", "10.78.0")):
            ip(ns, "link", "add", f"d{i}", "type", "veth", "peer", "name", f"e{i}")  # both ends stay here
            ip(ns, "addr", "add", f"{net}.2/24", "dev", f"d{i}")
            ip(ns, "link", "set", f"d{i}", "up")
            ip(ns, "link", "set", f"e{i}", "up")
        yield ns
    finally:
        delete_namespaces([ns])


def _wait_for_line(path: Path, needle: str, proc: subprocess.Popen, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in path.read_text().splitlines():
            if needle in line:
                return line
        assert proc.poll() is None, f"{path.name} exited: {path.read_text()[-2000:]}"
        time.sleep(0.3)
    raise AssertionError(f"no {needle!r} in {path.name} within {timeout:.0f} s: {path.read_text()[-2000:]}")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@needs_emulated_internet
@pytest.mark.swarm
@pytest.mark.parametrize("announce", [None, "10.78.0.2:31337"], ids=["multi-homed", "announce"])
def test_the_printed_join_line_runs_verbatim(tmp_path, announce):
    """An aggregator on 0.0.0.0 of a host with three addresses (or announcing one of them) prints a
    line; that line, pasted into a shell as printed, joins the task signed by that aggregator."""
    scripts = str(Path(console_script("manta-peer")).parent)
    env = dict(os.environ, HOME=str(tmp_path), PATH=f"{scripts}:{os.environ['PATH']}", PYTHONUNBUFFERED="1",
               MANTA_WORKER_THREADS="1", MANTA_LOG_LEVEL="INFO")  # fmt: skip
    (tmp_path / "task.toml").write_text('[task]\nid = "digits-join-line"\nname = "digits"\n')
    argv = ["manta-aggregator", "start", "--task", "task.toml", "--listen", "0.0.0.0:31337", "--http", "off"]
    argv += ["--announce", announce] if announce else []
    with _multi_homed_host() as ns:
        with open(tmp_path / "agg.out", "w") as out, open(tmp_path / "agg.err", "w") as err:
            agg = subprocess.Popen(in_namespace(ns, argv), stdout=out, stderr=err, env=env, cwd=tmp_path)
        peer = None
        try:
            line = _wait_for_line(tmp_path / "agg.out", "manta-peer join", agg, 90).strip()
            params = _parsed(line)
            hosts = {m.split("/")[2] for m in params["initial_peers"]}
            assert hosts == ({"10.78.0.2"} if announce else {"10.77.0.2", "10.78.0.2", "127.0.0.1"}), line
            key = Identity.load(tmp_path / ".manta" / "identity.key").public_key_hex  # the default key
            assert params["aggregator_key"] == key
            with open(tmp_path / "peer.out", "w") as out, open(tmp_path / "peer.err", "w") as err:
                peer = subprocess.Popen(in_namespace(ns, ["bash", "-c", line]), stdout=out, stderr=err,
                                        env=env, cwd=tmp_path)  # fmt: skip
            joined = _wait_for_line(tmp_path / "peer.err", "joined task digits-join-line", peer, 120)
            name = fingerprint(bytes.fromhex(key))
            assert f"aggregator {name}" in joined
            assert (
                f"aggregator {name} serving task" in (tmp_path / "agg.err").read_text()
            )  # one name for both
        finally:
            for proc in (peer, agg):
                if proc is not None:
                    _stop(proc)
