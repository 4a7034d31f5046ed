"""Peers leaving and joining on a schedule (``manta-swarm --churn``, a scenario's ``[churn]``).

Times count from the swarm's first committed round, so a slow start-up does not eat the schedule.
A victim is drawn from the running peers with the scenario's seeded generator (a run is repeatable);
with ``replace`` a new peer (new identity, new index) starts in the victim's site at once, as a
volunteer taking the leaver's place would.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable

from testbed.local_swarm import LocalSwarm
from testbed.wan.scenario import ChurnEvent, ChurnPlan, ScenarioError


def parse_churn(text: str, signal: str, replace: bool) -> ChurnPlan:
    """``every:60`` (a peer every 60 s) or ``at:30,90`` (at those times), as the option takes them."""
    kind, _, values = text.partition(":")
    try:
        numbers = [float(v) for v in values.split(",") if v.strip()]
    except ValueError:
        numbers = []
    if kind == "every" and len(numbers) == 1:
        return ChurnPlan(every_s=numbers[0], signal=signal, replace=replace)
    if kind == "at" and numbers:
        return ChurnPlan(at_s=tuple(numbers), signal=signal, replace=replace)
    raise ScenarioError(f"--churn must be every:SECONDS or at:T1,T2,..., got {text!r}")


class ChurnDriver:
    def __init__(self, plan: ChurnPlan, swarm: LocalSwarm, rng: random.Random, say: Callable[[str], None]):
        self.plan, self.swarm, self.rng, self.say = plan, swarm, rng, say
        self._at = deque(sorted(plan.at_s))
        self._events = deque(sorted(plan.events, key=lambda e: e.at_s))
        self._next_every = plan.every_s
        self.next_index = max((int(n.split("-")[1]) for n in swarm.peer_names()), default=-1) + 1
        self.killed: list[str] = []
        self.started: list[str] = []

    def tick(self, elapsed: float) -> None:
        """Carry out everything due by ``elapsed`` seconds after the first committed round."""
        while self._next_every is not None and self._next_every <= elapsed:
            self._kill(None, self.plan.signal)
            self._next_every += self.plan.every_s
        while self._at and self._at[0] <= elapsed:
            self._at.popleft()
            self._kill(None, self.plan.signal)
        while self._events and self._events[0].at_s <= elapsed:
            self._event(self._events.popleft())

    def _event(self, event: ChurnEvent) -> None:
        if event.start is not None:
            self._start(event.start)
        else:
            self._kill(None if event.kill == "random" else event.kill, event.signal or self.plan.signal)

    def _kill(self, name: str | None, how: str) -> None:
        running = sorted(self.swarm.running_peers())
        if name is None:
            if not running:
                return
            name = self.rng.choice(running)
        elif name not in running:
            self.say(f"churn: {name} is not running; nothing to stop")
            return
        self.swarm.signal_peer(name, how)
        self.killed.append(name)
        site = self.swarm.sites.get(name)
        self.say(
            f"churn: {'kill -9' if how == 'kill' else 'Ctrl-C'} {name}" + (f" in {site}" if site else "")
        )
        if self.plan.replace:
            self._start(site)

    def _start(self, site: str | None) -> None:
        name = f"peer-{self.next_index}"
        self.swarm.start_peer(self.next_index, site=site)
        self.next_index += 1
        self.started.append(name)
        self.say(f"churn: started {name}" + (f" in {site}" if site else ""))
