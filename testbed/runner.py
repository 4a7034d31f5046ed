"""One ``manta-swarm`` run from start to summary: build the network (if any), start the aggregator
and the peers, show progress, drive churn, stop everything, read the links' counters, summarise.

Every wait is bounded and every exit path — the end of the run, Ctrl-C, SIGTERM, an error — stops
every process and removes the emulated internet before returning.
"""

from __future__ import annotations

import random
import signal
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

from testbed.churn import ChurnDriver
from testbed.footprint import FootprintSampler
from testbed.interrupts import stop_signals_held, stop_signals_interrupt
from testbed.local_swarm import AGGREGATOR_GRACE_SECONDS, LocalSwarm, SwarmOptions
from testbed.summary import progress_line, summarise, write_summary
from testbed.wan.scenario import ChurnPlan, Scenario
from testbed.wan.topology import EmulatedInternet

POLL_SECONDS = 1.0


class RunFailed(RuntimeError):
    """The run could not start (the aggregator exited, the network could not be built)."""


def _placement(scenario: Scenario) -> list[str]:
    return [site.name for site in scenario.sites for _ in range(site.peers)]


def run_swarm(
    options: SwarmOptions,
    scenario: Scenario | None,
    churn_plan: ChurnPlan | None,
    say: Callable[[str], None],
    summary_path: Path | None = None,
    time_limit: float | None = None,
) -> dict[str, Any]:
    """Run the swarm described by ``options`` on ``scenario``'s emulated internet (None: on
    127.0.0.1), with ``churn_plan`` (None: no churn). After ``time_limit`` seconds the peers are
    asked to leave (they finish their round), whatever the swarm has reached."""
    with stop_signals_interrupt():  # Ctrl-C and SIGTERM both clean up
        return _run(options, scenario, churn_plan, say, summary_path, time_limit)


def _run(
    options: SwarmOptions,
    scenario: Scenario | None,
    churn_plan: ChurnPlan | None,
    say: Callable[[str], None],
    summary_path: Path | None,
    time_limit: float | None,
) -> dict[str, Any]:
    internet = EmulatedInternet(scenario, options.run_dir) if scenario is not None else None
    counters = None
    started = time.monotonic()
    swarm = None
    failed: list[str] = []  # peers that exited with an error (not the ones churn killed on purpose)
    footprints = FootprintSampler()
    try:
        if internet is not None:
            internet.start()
            say(
                f"emulated internet up: {len(scenario.sites)} site(s) + the aggregator's, "
                f"{sum(s.nat for s in scenario.sites)} behind NAT (namespaces {internet.core[:-5]}-*)"
            )
        swarm = LocalSwarm(options, internet, _placement(scenario) if scenario else None)
        try:
            swarm.start_aggregator()
        except RuntimeError as e:
            raise RunFailed(str(e)) from None
        say(
            f"aggregator up; starting {options.peers} peer(s) ({options.mode}-parallel, "
            f"{options.cohorts} cohort(s), {options.task})"
        )
        for i in range(options.peers):
            swarm.start_peer(i)
        churn = ChurnDriver(churn_plan, swarm, random.Random(options.seed), say) if churn_plan else None
        _watch(swarm, options, churn, started, say, time_limit, footprints)
        if "aggregator" in swarm.procs and swarm.procs["aggregator"].poll() is None:
            # here, not in the cleanup below, so that a Ctrl-C can still cut the wait short
            say(
                "peers done; the aggregator closes its last rounds and finishes its audits "
                f"(at most {AGGREGATOR_GRACE_SECONDS:.0f} s)"
            )
            swarm.stop(["aggregator"], grace=AGGREGATOR_GRACE_SECONDS)
        returncodes = {n: swarm.procs[n].returncode for n in swarm.peer_names()}
        failed = failed_peers(returncodes, swarm.signalled, churn.killed if churn else ())
        if failed:
            say(f"peer(s) {', '.join(failed)} exited with an error; see their log.txt")
    except KeyboardInterrupt:
        say("stopping: peers finish their round and leave (Ctrl-C again to kill)")
        if swarm is not None:
            try:
                swarm.stop()
            except KeyboardInterrupt:
                swarm.stop(grace=0.0)
    finally:
        with stop_signals_held(say):  # bounded; a further Ctrl-C must not leave namespaces behind
            try:
                if swarm is not None:
                    swarm.close()
                if internet is not None and internet._started:
                    counters = internet.link_counters()
            finally:
                if internet is not None:
                    internet.close()
    wall = time.monotonic() - started
    say(
        "all processes stopped"
        + (" and the emulated internet removed" if internet else "")
        + "; evaluating the final state"
    )
    summary = summarise(swarm, wall, link_counters=counters)
    summary["failed_peers"] = failed
    summary["footprint"] = footprints.summary()
    write_summary(summary, summary_path or swarm.dir / "summary.json")
    return summary


def failed_peers(
    returncodes: dict[str, int | None], signalled: dict[str, set[str]], killed_by_churn: Collection[str]
) -> list[str]:
    """The peers whose exit was a failure: not 0, not a kill (churn's or the stop's last resort), and
    not the SIGTERM of a stop that reached a peer still starting (one still importing has no handler
    installed yet, and the signal's default action ends it)."""
    failed = []
    for name, code in returncodes.items():
        stopped = code == -signal.SIGTERM and "term" in signalled.get(name, ())
        if code not in (0, None, -signal.SIGKILL) and not stopped and name not in killed_by_churn:
            failed.append(name)
    return failed


def _watch(
    swarm: LocalSwarm,
    options: SwarmOptions,
    churn: ChurnDriver | None,
    started: float,
    say,
    time_limit: float | None,
    footprints: FootprintSampler,
) -> None:
    """Until every peer has left: a progress line per committed round, churn on its schedule, each
    peer's processes and memory sampled."""
    shown, first_commit = -1, None
    while swarm.peers_running():
        time.sleep(POLL_SECONDS)
        footprints.tick({name: swarm.procs[name].pid for name in swarm.running_peers()})
        if time_limit is not None and time.monotonic() - started > time_limit:
            say(f"time limit of {time_limit:.0f} s reached: the peers finish their round and leave")
            swarm.stop()
            break
        swarm.record_exits()
        line = progress_line(swarm, options.rounds)
        if line is not None:
            if first_commit is None:
                first_commit = time.monotonic()
            if line[0] > shown:
                shown = line[0]
                say(f"[{time.monotonic() - started:6.0f}s] {line[1]}")
        if churn is not None and first_commit is not None and shown + 1 < options.rounds:
            churn.tick(time.monotonic() - first_commit)
    swarm.record_exits()
