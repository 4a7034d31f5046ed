"""The join line the aggregator prints runs as printed: every address, one flag each, and its key."""

from __future__ import annotations

import contextlib
import os
import secrets
import shlex
import signal
import subprocess
from pathlib import Path

import pytest

from aggregator.join_line import join_command
from peer.cli import join as join_cli
from protocol.identity import Identity, fingerprint
from testbed.wan.netns import PREFIX, delete_namespaces, in_namespace, ip
from tests.helpers import console_script, needs_emulated_internet, wait_for_line

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
def test_the_printed_join_line_runs_verbatim(tmp_path):
    """On a host with three addresses, one aggregator on 0.0.0.0 and one announcing one of them each
    print a line; each line, pasted into a shell as printed, joins the task signed by that aggregator.
    The two swarms run side by side (their own DHTs, homes and keys)."""
    scripts = str(Path(console_script("manta-peer")).parent)
    cases = {
        "multi-homed": (31337, None, {"10.77.0.2", "10.78.0.2", "127.0.0.1"}),
        "announce": (31338, "10.78.0.2:31338", {"10.78.0.2"}),
    }
    procs: list[subprocess.Popen] = []
    with _multi_homed_host() as ns:
        try:
            for name, (port, announce, _hosts) in cases.items():
                home = tmp_path / name
                home.mkdir()
                (home / "task.toml").write_text(f'[task]\nid = "join-line-{name}"\nname = "digits"\n')
                argv = [
                    "manta-aggregator",
                    "start",
                    "--task",
                    "task.toml",
                    "--listen",
                    f"0.0.0.0:{port}",
                    "--http",
                    "off",
                ]
                argv += ["--announce", announce] if announce else []
                with open(home / "agg.out", "w") as out, open(home / "agg.err", "w") as err:
                    procs.append(
                        subprocess.Popen(
                            in_namespace(ns, argv),
                            stdout=out,
                            stderr=err,
                            env=_home_env(home, scripts),
                            cwd=home,
                        )
                    )
            for (name, (_port, _announce, hosts)), agg in zip(cases.items(), list(procs)):
                home = tmp_path / name
                line = wait_for_line(home / "agg.out", "manta-peer join", agg, 90).strip()
                params = _parsed(line)
                assert {m.split("/")[2] for m in params["initial_peers"]} == hosts, line
                key = Identity.load(home / ".manta" / "identity.key").public_key_hex  # the default key
                assert params["aggregator_key"] == key
                with open(home / "peer.out", "w") as out, open(home / "peer.err", "w") as err:
                    procs.append(subprocess.Popen(in_namespace(ns, ["bash", "-c", line]), stdout=out, stderr=err,
                                                  env=_home_env(home, scripts), cwd=home))  # fmt: skip
            for (name, _case), peer in zip(cases.items(), procs[len(cases) :]):
                home = tmp_path / name
                joined = wait_for_line(home / "peer.err", f"joined task join-line-{name}", peer, 120)
                key = Identity.load(home / ".manta" / "identity.key").public_key_hex
                fp = fingerprint(bytes.fromhex(key))
                assert f"aggregator {fp}" in joined
                assert f"aggregator {fp} serving task" in (home / "agg.err").read_text()  # one name for both
        finally:
            for proc in reversed(procs):
                _stop(proc)


def _home_env(home: Path, scripts: str) -> dict:
    return dict(os.environ, HOME=str(home), PATH=f"{scripts}:{os.environ['PATH']}", PYTHONUNBUFFERED="1",
                MANTA_WORKER_THREADS="1", MANTA_LOG_LEVEL="INFO")  # fmt: skip
