"""What an emulated internet looks like: sites, their links, NAT, and a churn schedule.

A *site* is a home or office: one network namespace whose processes share a /24 LAN, behind one
access link to the emulated internet core. Its link has an uplink and a downlink rate, a one-way delay
between the site and the core, jitter and loss; a path between two sites crosses both sites' links, so
two sites with ``delay = 40`` are 80 ms apart one way (160 ms round trip). A NAT site sits behind a
home router that lets connections out and none in. The aggregator has a site of its own (by default a
datacenter link: 1 Gbit/s each way, the sites' delay, no jitter, no loss).

The scenario comes from command-line options (every site alike) or from a TOML file
(see :func:`load_scenario` and ``testbed/scenarios/``) for sites that differ and a churn schedule.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from testbed.wan.rates import RateError, parse_rate

ChurnSignal = Literal["kill", "int"]
DATACENTER_RATE = 10**9


class ScenarioError(ValueError):
    """A scenario that cannot be built; the message is one line for the user."""


@dataclass(frozen=True)
class LinkProfile:
    """One site's access link. Rates in bit/s (None: not shaped); delay and jitter in ms, one way."""

    uplink_bps: int | None = None
    downlink_bps: int | None = None
    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    loss_pct: float = 0.0

    def __post_init__(self):
        if not 0 <= self.delay_ms <= 10_000:
            raise ScenarioError(f"delay must be 0..10000 ms, got {self.delay_ms}")
        if not 0 <= self.jitter_ms <= max(self.delay_ms, 0):
            raise ScenarioError(
                f"jitter must be between 0 and the delay ({self.delay_ms} ms), got {self.jitter_ms}"
            )
        if not 0 <= self.loss_pct < 100:
            raise ScenarioError(f"loss must be a percentage in [0, 100), got {self.loss_pct}")


@dataclass(frozen=True)
class SiteSpec:
    name: str
    peers: int
    link: LinkProfile
    nat: bool = False


@dataclass(frozen=True)
class ChurnEvent:
    """At ``at_s`` seconds, kill the peer named ``kill`` or start a new peer in site ``start``."""

    at_s: float
    kill: str | None = None  # a peer name ("peer-3"), or "random"
    start: str | None = None  # a site name
    signal: ChurnSignal | None = None  # None: the plan's signal


@dataclass(frozen=True)
class ChurnPlan:
    """Peers leaving and joining. Times count from the swarm's first committed round, so a slow
    start-up does not eat the schedule. ``every_s`` kills a random running peer at that interval;
    ``at_s`` at those times; ``replace`` starts a new peer in the victim's site right away."""

    every_s: float | None = None
    at_s: tuple[float, ...] = ()
    signal: ChurnSignal = "kill"
    replace: bool = True
    events: tuple[ChurnEvent, ...] = ()

    def __post_init__(self):
        if self.every_s is not None and self.every_s <= 0:
            raise ScenarioError(f"churn every must be a positive number of seconds, got {self.every_s}")
        if any(t < 0 for t in self.at_s) or any(e.at_s < 0 for e in self.events):
            raise ScenarioError("churn times must not be negative")
        if self.signal not in ("kill", "int"):
            raise ScenarioError(
                f"churn signal must be 'kill' (kill -9) or 'int' (Ctrl-C), got {self.signal!r}"
            )

    def scheduled_kills(self, until_s: float) -> list[float]:
        """Every kill time of ``every_s`` and ``at_s`` up to ``until_s``, sorted."""
        times = list(self.at_s)
        if self.every_s:
            times += [self.every_s * k for k in range(1, int(until_s / self.every_s) + 1)]
        return sorted(times)


@dataclass(frozen=True)
class Scenario:
    sites: tuple[SiteSpec, ...]
    aggregator: LinkProfile
    churn: ChurnPlan | None = None
    seed: int = 0

    def __post_init__(self):
        if not self.sites:
            raise ScenarioError("a scenario needs at least one site")
        if len(self.sites) > 250:
            raise ScenarioError(f"at most 250 sites, got {len(self.sites)}")
        names = [s.name for s in self.sites]
        if len(set(names)) != len(names):
            raise ScenarioError(f"site names must be unique, got {names}")
        if self.peers < 1:
            raise ScenarioError("the sites hold no peer")

    @property
    def peers(self) -> int:
        return sum(s.peers for s in self.sites)

    def site(self, name: str) -> SiteSpec:
        for s in self.sites:
            if s.name == name:
                return s
        raise ScenarioError(f"no site named {name!r} (sites: {', '.join(s.name for s in self.sites)})")


def datacenter_link(sites_link: LinkProfile) -> LinkProfile:
    """The aggregator's default link: as far from the core as the sites, fast and clean."""
    return LinkProfile(DATACENTER_RATE, DATACENTER_RATE, sites_link.delay_ms, 0.0, 0.0)


def uniform_scenario(
    sites: int,
    peers: int,
    link: LinkProfile,
    nat: int = 0,
    churn: ChurnPlan | None = None,
    seed: int = 0,
) -> Scenario:
    """``sites`` alike, ``peers`` dealt out round-robin, the last ``nat`` sites behind NAT."""
    if sites < 1:
        raise ScenarioError("--sites must be at least 1")
    if peers < sites:
        raise ScenarioError(f"--peers {peers} is fewer than --sites {sites}: every site needs a peer")
    if not 0 <= nat <= sites:
        raise ScenarioError(f"--nat {nat} must be between 0 and --sites {sites}")
    specs = tuple(
        SiteSpec(f"site-{i + 1}", peers // sites + (i < peers % sites), link, nat=i >= sites - nat)
        for i in range(sites)
    )
    return Scenario(specs, datacenter_link(link), churn, seed)


# ---------------------------------------------------------------------------------------- TOML files

_LINK_KEYS = {"uplink", "downlink", "delay", "jitter", "loss"}
_SITE_KEYS = _LINK_KEYS | {"name", "peers", "nat"}
_CHURN_KEYS = {"every", "at", "signal", "replace", "event"}
_EVENT_KEYS = {"at", "kill", "start", "signal"}
_TOP_KEYS = {"seed", "link", "aggregator", "site", "churn"}
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,31}$")


def _check_keys(table: dict, allowed: set[str], where: str) -> None:
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise ScenarioError(
            f"{where}: unknown key(s) {', '.join(unknown)} (allowed: {', '.join(sorted(allowed))})"
        )


def _number(table: dict, key: str, where: str, default: float) -> float:
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ScenarioError(f"{where}: {key} must be a number, got {value!r}")
    return float(value)


def _link(table: dict, where: str, base: LinkProfile) -> LinkProfile:
    try:
        up = parse_rate(table["uplink"]) if "uplink" in table else base.uplink_bps
        down = parse_rate(table["downlink"]) if "downlink" in table else base.downlink_bps
    except RateError as e:
        raise ScenarioError(f"{where}: {e}") from None
    return LinkProfile(
        up,
        down,
        _number(table, "delay", where, base.delay_ms),
        _number(table, "jitter", where, base.jitter_ms),
        _number(table, "loss", where, base.loss_pct),
    )


def _churn(table: dict, where: str = "[churn]") -> ChurnPlan:
    _check_keys(table, _CHURN_KEYS, where)
    at = table.get("at", [])
    if not isinstance(at, list) or not all(
        isinstance(t, int | float) and not isinstance(t, bool) for t in at
    ):
        raise ScenarioError(f"{where}: at must be a list of seconds, got {at!r}")
    events = []
    for n, event in enumerate(table.get("event", [])):
        here = f"[[churn.event]] #{n + 1}"
        if not isinstance(event, dict):
            raise ScenarioError(f"{here}: must be a table")
        _check_keys(event, _EVENT_KEYS, here)
        if ("kill" in event) == ("start" in event):
            raise ScenarioError(f'{here}: give exactly one of kill = "peer-N" or start = "SITE"')
        events.append(
            ChurnEvent(
                _number(event, "at", here, -1.0),
                kill=str(event["kill"]) if "kill" in event else None,
                start=str(event["start"]) if "start" in event else None,
                signal=event.get("signal"),
            )
        )
    every = table.get("every")
    if every is not None and (isinstance(every, bool) or not isinstance(every, int | float)):
        raise ScenarioError(f"{where}: every must be a number of seconds, got {every!r}")
    replace_ = table.get("replace", True)
    if not isinstance(replace_, bool):
        raise ScenarioError(f"{where}: replace must be true or false, got {replace_!r}")
    return ChurnPlan(
        float(every) if every is not None else None,
        tuple(float(t) for t in at),
        table.get("signal", "kill"),
        replace_,
        tuple(events),
    )


def load_scenario(path: Path) -> Scenario:
    """Read a scenario file; every mistake is one line naming the table and key."""
    try:
        data = tomllib.loads(Path(path).read_text())
    except OSError as e:
        raise ScenarioError(f"cannot read scenario {path}: {e.strerror or e}") from None
    except tomllib.TOMLDecodeError as e:
        raise ScenarioError(f"scenario {path} is not valid TOML: {e}") from None
    _check_keys(data, _TOP_KEYS, str(path))
    for key in ("link", "aggregator", "churn"):
        if key in data and not isinstance(data[key], dict):
            raise ScenarioError(f"{path}: [{key}] must be a table")
    _check_keys(data.get("link", {}), _LINK_KEYS, "[link]")
    _check_keys(data.get("aggregator", {}), _LINK_KEYS, "[aggregator]")
    default = _link(data.get("link", {}), "[link]", LinkProfile())
    raw_sites = data.get("site", [])
    if not isinstance(raw_sites, list) or not raw_sites:
        raise ScenarioError(f"{path}: needs at least one [[site]]")
    sites = []
    for n, raw in enumerate(raw_sites):
        where = f"[[site]] #{n + 1}"
        if not isinstance(raw, dict):
            raise ScenarioError(f"{where}: must be a table")
        _check_keys(raw, _SITE_KEYS, where)
        name = str(raw.get("name", f"site-{n + 1}"))
        if not _NAME.match(name):
            raise ScenarioError(f"{where}: name must be 1-32 letters, digits, '-' or '_', got {name!r}")
        peers = raw.get("peers", 1)
        if isinstance(peers, bool) or not isinstance(peers, int) or not 0 <= peers <= 64:
            raise ScenarioError(f"{where}: peers must be a whole number 0..64, got {peers!r}")
        nat = raw.get("nat", False)
        if not isinstance(nat, bool):
            raise ScenarioError(f"{where}: nat must be true or false, got {nat!r}")
        sites.append(SiteSpec(name, peers, _link(raw, where, default), nat))
    aggregator = _link(data.get("aggregator", {}), "[aggregator]", datacenter_link(default))
    churn = _churn(data["churn"]) if "churn" in data else None
    seed = data.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ScenarioError(f"{path}: seed must be a whole number, got {seed!r}")
    scenario = Scenario(tuple(sites), aggregator, churn, seed)
    for event in churn.events if churn else ():
        if event.start is not None:
            scenario.site(event.start)  # raises with the list of sites
    return scenario


def with_churn(scenario: Scenario, churn: ChurnPlan | None) -> Scenario:
    return replace(scenario, churn=churn) if churn is not None else scenario
