"""Reachability on the emulated internet: the aggregator prints its join line; on a public site and
on a home behind NAT, `manta-peer check` with that line's options reports the swarm, its task and
whether the swarm can connect in. Then (slow) two volunteers on the public site and one at home run
the printed line as printed: the one behind NAT finds it cannot be reached, runs in client mode and
says so in one line with what to change; the public ones stay servers; all three commit together."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from testbed.local_swarm import SwarmOptions, task_toml
from testbed.wan.netns import namespaces
from testbed.wan.scenario import LinkProfile, uniform_scenario
from testbed.wan.topology import EmulatedInternet
from tests.helpers import console_script, needs_emulated_internet, wait_for_line

pytestmark = [pytest.mark.swarm, needs_emulated_internet]

ROUNDS = 2  # committed together by the three volunteers
UNREACHABLE = "the swarm cannot connect to this peer"


def _env(home: Path) -> dict:
    scripts = str(Path(console_script("manta-peer")).parent)
    home.mkdir(parents=True, exist_ok=True)
    return dict(os.environ, HOME=str(home), PATH=f"{scripts}:{os.environ['PATH']}", PYTHONUNBUFFERED="1",
                MANTA_WORKER_THREADS="1", MANTA_LOG_LEVEL="INFO")  # fmt: skip


def _committed_together(folder: Path, volunteers: int) -> int:
    """Rounds this volunteer committed with every volunteer contributing."""
    path = folder / "manta-peer" / "rounds.jsonl"
    count = 0
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line being written
        count += bool(record.get("committed") and record.get("contributors") == volunteers)
    return count


def _stop(proc: subprocess.Popen | None, grace: float = 60) -> None:
    if proc is not None and proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


SITES = {"aggregator": "aggregator", "public-a": "site-1", "public-b": "site-1", "home": "site-2",
         "check-public": "site-1", "check-home": "site-2"}  # fmt: skip


@dataclass
class NatSwarm:
    """An emulated internet (a public site, a home behind NAT), its aggregator and its join line."""

    net: EmulatedInternet
    folders: dict[str, Path]
    log: dict[str, Path]
    procs: dict[str, subprocess.Popen]
    line: str  # the aggregator's printed join line
    start: Callable[[str, list[str]], subprocess.Popen]  # a named process on its site


@contextmanager
def nat_swarm(tmp_path: Path) -> Iterator[NatSwarm]:
    before = set(namespaces())
    link = LinkProfile(50_000_000, 50_000_000, 5, 0, 0)
    options = SwarmOptions(peers=3, task="digits", rounds=40, target_samples=64, subnets=2, width_mult="0.25",
                           batch_size=16)  # fmt: skip
    folders = {name: tmp_path / name for name in SITES}
    for folder in folders.values():
        folder.mkdir()
    (folders["aggregator"] / "task.toml").write_text(task_toml(options))
    procs: dict[str, subprocess.Popen] = {}
    log = {name: folders[name] / f"{name}.err" for name in folders}
    with EmulatedInternet(uniform_scenario(2, 3, link, nat=1), tmp_path / "net") as net:
        try:

            def start(name: str, argv: list[str]) -> subprocess.Popen:
                with open(folders[name] / f"{name}.out", "w") as out, open(log[name], "w") as err:
                    procs[name] = net.popen(SITES[name], argv, stdout=out, stderr=err,
                                            env=_env(folders[name] / "home"), cwd=folders[name])  # fmt: skip
                return procs[name]

            agg = start("aggregator", ["manta-aggregator", "start", "--task", "task.toml", "--listen",
                                       "0.0.0.0:31337", "--http", "off"])  # fmt: skip
            line = wait_for_line(
                folders["aggregator"] / "aggregator.out", "manta-peer join", agg, 120
            ).strip()
            assert line.startswith("manta-peer join ") and "/ip4/10.0.0.2/tcp/31337/p2p/" in line, line
            yield NatSwarm(net, folders, log, procs, line, start)
        finally:
            for name in [n for n in procs if n != "aggregator"] + ["aggregator"]:
                _stop(procs.get(name), grace=180 if name == "aggregator" else 60)
    assert not set(namespaces()) - before, "the test left namespaces behind"


def test_check_on_a_public_site_and_behind_nat_says_whether_the_swarm_can_connect(tmp_path):
    """The preflight, on both sites at once: the printed line's options, `check` for `join`."""
    with nat_swarm(tmp_path) as swarm:
        check_line = swarm.line.replace("manta-peer join", "manta-peer check", 1) + " --json"
        checks = ("check-public", "check-home")
        for name in checks:
            swarm.start(name, ["bash", "-c", check_line])
        reports = {}
        for name in checks:
            assert swarm.procs.pop(name).wait(timeout=180) == 0, swarm.log[name].read_text()[-3000:]
            reports[name] = json.loads((swarm.folders[name] / f"{name}.out").read_text())
        public, home = swarm.net.sites["site-1"], swarm.net.sites["site-2"]
    for report in reports.values():
        assert report["error"] is None and report["task"]["task_id"] == "digits-local", report
        assert [p["answered"] for p in report["initial_peers"]] == [True], report["initial_peers"]
        assert report["devices"] and report["memory"]["available_bytes"] > 0, report
        assert report["disk"]["free_bytes"] > 0, report
    reach = reports["check-public"]["reachability"]
    assert reach["verdict"] == "reachable" and reach["seen_from"] == [public.address], reach
    assert "join runs as a server" in reach["summary"], reach
    reach = reports["check-home"]["reachability"]
    assert reach["verdict"] == "unreachable", reach
    # dialled at the router's address it connects from, never at its private one
    assert reach["seen_from"] == [home.public_address], reach
    assert {d["address"].rsplit(":", 1)[0] for d in reach["dialed"]} == {home.public_address}, reach
    assert all(d["outcome"] == "no answer" for d in reach["dialed"]), reach
    assert f"--announce {home.public_address}:" in reach["summary"], reach
    assert "join would run in client mode" in reach["summary"], reach


# Slow (about 2 minutes; `make test-all`): the default suite runs the printed line verbatim on a
# multi-homed host (tests/aggregator/test_join_line.py) and `check` behind NAT (above).
@pytest.mark.slow
def test_a_volunteer_behind_nat_joins_with_the_printed_line_alone(tmp_path):
    # Two public volunteers start together and the one at home joins them: a swarm's first round
    # committed by a lone peer is one no later joiner may load (no quorum holds it), so the test does
    # not leave its outcome to which of two volunteers starts first.
    volunteers = ["public-a", "public-b", "home"]
    with nat_swarm(tmp_path) as swarm:
        log, procs, folders = swarm.log, swarm.procs, swarm.folders
        home = swarm.net.sites["site-2"]
        for name in volunteers:  # the printed line, pasted as printed, by each volunteer
            swarm.start(name, ["bash", "-c", swarm.line])
        said = wait_for_line(log["home"], UNREACHABLE, procs["home"], 180)
        assert "client mode" in said and f"--announce {home.public_address}:" in said, said
        for name in ("public-a", "public-b"):
            wait_for_line(log[name], "reachable: node", procs[name], 180)
        deadline = time.monotonic() + 300
        while min(_committed_together(folders[name], len(volunteers)) for name in volunteers) < ROUNDS:
            for name in volunteers:
                assert procs[name].poll() is None, log[name].read_text()[-3000:]
            assert time.monotonic() < deadline, [log[name].read_text()[-2000:] for name in volunteers]
            time.sleep(1.0)
        for name in volunteers:  # all at once: each finishes its round and leaves
            procs[name].send_signal(signal.SIGTERM)
        for name in volunteers:
            assert procs.pop(name).wait(timeout=90) == 0, log[name].read_text()[-3000:]
        # the one at home said it once; the public ones never
        said = [ln for ln in log["home"].read_text().splitlines() if UNREACHABLE in ln]
        assert len(said) == 1, said
        assert all("client mode" not in log[name].read_text() for name in ("public-a", "public-b"))
