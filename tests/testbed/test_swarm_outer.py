"""`manta-swarm --sync outer` on an emulated internet: two sites (a cohort each) take their inner steps
apart, meet every few rounds in an overlapped outer step across the wide-area links, and every peer
ends holding one state; the run removes its namespaces and processes.

The second site is a home behind NAT with two volunteers: a cohort made only of client-mode peers,
which nobody outside can reach. They average with each other over their LAN (each serves its own
cohort) and connect out for the outer steps; before that, such a cohort aborted every inner step."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from supernet.checkpoint import load_checkpoint
from testbed.wan.netns import namespaces
from tests.helpers import console_script, needs_emulated_internet, processes_mentioning, socket_files

# Slow (about 2.5 minutes; `make test-all`): the default suite covers its parts one by one: the outer
# step's math, plan and repair (tests/peer/test_outer_step.py, test_outer_repair.py), known cohort
# groups (tests/peer/averaging/test_known_cohort.py), NAT (tests/testbed/test_emulated_internet.py) and
# a NAT'd peer's dial-back (tests/peer/test_reachability_wan.py).
pytestmark = [
    pytest.mark.swarm,
    pytest.mark.slow,
    needs_emulated_internet,
]

# Two periods of two inner steps each: the fewest rounds that show both an outer step overlapped with
# the next period's compute and one taken as the run ends.
INNER, ROUNDS = 2, 4
SMALL = ["--target-samples", "64", "--subnets", "2", "--width-mult", "0.25", "--batch-size", "16"]


def _lines(path) -> list[dict]:
    return (
        [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    )


def test_two_sites_take_inner_steps_apart_and_meet_in_overlapped_outer_steps(tmp_path):
    run, summary_path = tmp_path / "run", tmp_path / "summary.json"
    before, sockets_before = set(namespaces()), socket_files()
    cmd = [console_script("manta-swarm"), "--sites", "2", "--peers", "4", "--uplink", "20mbit", "--downlink",
           "50mbit", "--delay", "10", "--nat", "1", "--sync", "outer", "--inner-steps", str(INNER), "--rounds", str(ROUNDS), *SMALL,
           "--data-dir", str(run), "--summary", str(summary_path)]  # fmt: skip
    done = subprocess.run(
        cmd, capture_output=True, text=True, timeout=600, env=dict(os.environ, MANTA_WORKER_THREADS="1")
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "the emulated internet removed" in done.stdout + done.stderr
    assert not set(namespaces()) - before, "the run left namespaces behind"
    assert processes_mentioning(run) == [], "the run left processes behind"
    # the aggregator shut down by itself, its last audits run: no socket file of its own left in /tmp
    exits = {e["name"]: e["returncode"] for e in _lines(run / "processes.jsonl") if e["event"] == "exit"}
    assert exits.get("aggregator") == 0, exits
    assert "contributions: {" in (run / "aggregator" / "log.txt").read_text()
    assert not socket_files() - sockets_before, socket_files() - sockets_before
    summary = json.loads(summary_path.read_text())
    swarm = summary["swarm"]
    nat = {site["name"]: site["nat"] for site in summary["sites"]}
    assert nat == {"aggregator": False, "site-1": False, "site-2": True}, nat
    # manta-swarm passes no --client-mode: the home's peers find out they cannot be dialled, the
    # public site's that they can (the dial-back of peer/reachability.py)
    for peer in summary["peers_detail"]:
        log = (run / peer["name"] / "log.txt").read_text()
        unreachable = "the swarm cannot connect to this peer" in log
        assert unreachable == nat[peer["site"]] and ("reachable:" in log) != unreachable, (
            peer["name"],
            log[-2000:],
        )

    # Inner steps stay inside a site: no committed round averaged more than its cohort (2 peers),
    # and each peer's cohort is the one of its site.
    cohorts_by_site: dict[str, set[str]] = {}
    for peer in summary["peers_detail"]:
        rounds = _lines(run / peer["name"] / "rounds.jsonl")
        committed = [r for r in rounds if r["committed"]]
        assert len(committed) == ROUNDS, (peer["name"], [r.get("reason") for r in rounds])
        assert all(r["contributors"] <= 2 for r in committed), [r["contributors"] for r in committed]
        # the cohort's members know each other from the roster: most inner steps skip matchmaking (the
        # first has no previous attempt to show that the partner is alive, a cohort of one needs none)
        known = [r for r in committed if r["known_group"]]
        assert len(known) >= ROUNDS - 2 and all(r["contributors"] == 2 for r in known), [
            (r["round"], r["known_group"], r["contributors"], r["stages"]) for r in rounds
        ]
        cohorts_by_site.setdefault(peer["site"], set()).update(r["cohort"] for r in committed)
    assert len(cohorts_by_site) == 2 and all(len(c) == 1 for c in cohorts_by_site.values()), cohorts_by_site
    assert len(set.union(*cohorts_by_site.values())) == 2  # two sites, two cohorts

    # Two periods, two outer steps (the second taken as the run ends), each across both cohorts,
    # and after each every peer holds the same global parameters and outer momentum.
    assert swarm["outer_steps"] == 2, swarm
    assert swarm["identical_outer_states"] is True
    for peer in summary["peers_detail"]:
        steps = _lines(run / peer["name"] / "outer.jsonl")
        assert [s["attempt"] for s in steps if s["committed"]] == [0, 1], steps
        assert all((s["contributors"], s["cohorts"]) == (4, 2) for s in steps), steps
        # overlapped: the exchange ran while the next period computed; the round waited far less
        assert steps[0]["blocked_seconds"] < steps[0]["seconds"], steps[0]
    # the run ends on the last outer step's global state: one state on every peer
    assert summary["identical_final_state"] is True, summary["final_digests"]
    # the aggregator fetched a served state in the outer layout and checkpointed the global parameters
    # after the first period's end (the only state it writes in an outer task: they change there)
    written = sorted(p.name for p in (run / "aggregator" / "checkpoints").glob("round-*.pt"))
    assert written == [f"round-{INNER - 1:08d}.pt"], written
    assert load_checkpoint(run / "aggregator" / "checkpoints" / written[0]).round == INNER - 1
