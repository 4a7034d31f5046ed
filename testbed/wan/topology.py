"""An emulated internet on this machine: a core router, one namespace pair per site, shaped links.

::

    site k LAN ns  ──veth──  site k router ns ──wan0 [TAP]──relay──[TAP] s<k]── core ns ── other sites
    (peers run here)         (NAT for NAT sites;   tbf: uplink             tbf: downlink
                              tbf, counters)        relay: delay, jitter, loss

Site 0 is the aggregator's. Addresses: the access link of site k is 10.255.k.0/24 (core .1, site
router .2); a public site's LAN is 10.0.k.0/24 (router .1, hosts .2), routed by the core; every NAT
site's LAN is 192.168.1.0/24, as home routers have it, reaching out through its router's
10.255.k.2. All addresses are private (RFC 1918) and live only inside namespaces this run creates:
libp2p's DHT keeps only private or public addresses (an address of any other range, such as RFC
2544's 198.18.0.0/15, is dropped and peers can never look each other up), and no public address may
stand for a test host here.

Clean-up: a state file under ``/run/manta-testbed/`` names the namespaces before they are created,
with the owner's pid; :meth:`EmulatedInternet.close` (also on Ctrl-C and errors) stops every process
inside them and deletes them, and the next run deletes any set whose owner has died.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import select
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from testbed.wan.netns import (
    PREFIX,
    TestbedError,
    delete_namespaces,
    in_namespace,
    ip,
    namespaces,
    require_privileges,
    run,
    sysctl,
)
from testbed.wan.scenario import LinkProfile, Scenario

logger = logging.getLogger("manta.testbed")

STATE_DIR = Path(os.environ.get("MANTA_TESTBED_STATE", "/run/manta-testbed"))
AGGREGATOR_SITE = "aggregator"
NAT_LAN = "192.168.1"
WAN_NET = "10.255"  # access link k: 10.255.k.0/24
PROBE_NET = "10.254.0"  # the link checks' measurement host, on the core
PROBE_HOST = f"{PROBE_NET}.2"
TCP_BUFFER_MAX = (
    16 * 2**20
)  # as tuned hosts have it; Linux's 4-6 MiB default cannot fill 200 Mbit/s at 300 ms


@dataclass(frozen=True)
class SiteNetwork:
    """Where a site's processes run and how the rest of the internet sees them."""

    name: str
    index: int  # 0: the aggregator's site
    namespace: str  # the site's LAN: its processes run here
    router: str  # the site's router: holds the access link (wan0) and, for NAT sites, the NAT
    address: str  # the LAN address its processes bind to
    public_address: str  # what other sites see as the source of its connections
    link: LinkProfile
    nat: bool


@dataclass(frozen=True)
class LinkCounters:
    """What crossed one site's access link, read from the kernel's counters of the site's ``wan0``
    (every frame: TCP and UDP, headers, retransmissions, DHT chatter) and from the relay."""

    sent_bytes: int
    received_bytes: int
    sent_frames: int
    received_frames: int
    lost_up_frames: int  # dropped on the wire by the configured loss
    lost_down_frames: int
    shaper_drops_up: int  # dropped by the rate limiter's full queue (congestion)
    shaper_drops_down: int
    # frames the link's TAP could not queue for the relay (it fell behind reading them)
    tap_drops_up: int = 0
    tap_drops_down: int = 0
    # of sent/received, what went to or came from the aggregator's site (IP bytes, iptables counters)
    to_aggregator_bytes: int = 0
    from_aggregator_bytes: int = 0
    # the relay's timing under load: mean and worst lateness of delayed frames, and how many were >5 ms late
    late_ms_mean: float = 0.0
    late_ms_max: float = 0.0
    late_over_5ms_frames: int = 0


def _lateness(relay: dict) -> dict:
    ways = [relay.get(w, {}) for w in ("up", "down")]
    frames = sum(w.get("delayed_frames", 0) for w in ways)
    return {
        "late_ms_mean": round(sum(w.get("late_ms_total", 0.0) for w in ways) / frames, 3) if frames else 0.0,
        "late_ms_max": round(max(w.get("late_ms_max", 0.0) for w in ways), 2),
        "late_over_5ms_frames": sum(w.get("late_over_5ms", 0) for w in ways),
    }


def _owner_alive(pid: int, started: float) -> bool:
    try:
        return abs(psutil.Process(pid).create_time() - started) < 1.0
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def remove_stale(state_dir: Path = STATE_DIR) -> list[str]:
    """Delete every testbed namespace whose run has died (its owner is gone or never wrote a state file);
    returns the names removed. A live run's namespaces are left alone."""
    live: set[str] = set()
    stale: list[str] = []
    for path in sorted(state_dir.glob("*.json")) if state_dir.exists() else []:
        try:
            state = json.loads(path.read_text())
            alive = _owner_alive(int(state["owner"]), float(state["owner_started"]))
        except (OSError, ValueError, KeyError):
            alive, state = False, {"namespaces": []}
        if alive:
            live.update(state["namespaces"])
        else:
            stale += state.get("namespaces", [])
            path.unlink(missing_ok=True)
    stale += [ns for ns in namespaces() if ns.startswith(PREFIX) and ns not in live and ns not in stale]
    present = [ns for ns in stale if ns in set(namespaces())]
    if present:
        delete_namespaces(present)
        logger.info(f"removed {len(present)} namespace(s) a killed testbed run left behind")
    return present


class EmulatedInternet:
    """Builds the scenario's network on :meth:`start`; :meth:`close` removes every trace of it."""

    def __init__(
        self, scenario: Scenario, workdir: Path, run_id: str | None = None, probe_host: bool = False
    ):
        """``probe_host`` adds a measurement server on the core (an unshaped veth): link checks send
        from there, so their traffic is forwarded through the links like everyone else's (a sender
        inside the core itself would sit right behind the rate limiter and back off early)."""
        self.scenario = scenario
        self.workdir = Path(workdir).resolve()
        self.run_id = run_id or secrets.token_hex(3)
        self.core = f"{PREFIX}{self.run_id}-core"
        self.probe_namespace = f"{PREFIX}{self.run_id}-probe" if probe_host else None
        self.sites: dict[str, SiteNetwork] = {}
        specs = [(AGGREGATOR_SITE, scenario.aggregator, False)] + [
            (s.name, s.link, s.nat) for s in scenario.sites
        ]
        for k, (name, link, nat) in enumerate(specs):
            lan = NAT_LAN if nat else f"10.0.{k}"
            self.sites[name] = SiteNetwork(
                name=name,
                index=k,
                namespace=f"{PREFIX}{self.run_id}-s{k}",
                router=f"{PREFIX}{self.run_id}-s{k}r",
                address=f"{lan}.2",
                public_address=f"{WAN_NET}.{k}.2" if nat else f"{lan}.2",
                link=link,
                nat=nat,
            )
        self._relays: dict[str, subprocess.Popen] = {}
        self._state_file = STATE_DIR / f"{self.run_id}.json"
        self._started = False

    @property
    def namespace_names(self) -> list[str]:
        extra = [self.probe_namespace] if self.probe_namespace else []
        return [self.core, *extra] + [n for s in self.sites.values() for n in (s.router, s.namespace)]

    # ------------------------------------------------------------------ building

    def start(self) -> EmulatedInternet:
        require_privileges()
        remove_stale()
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        me = psutil.Process()
        # Written before the first namespace exists: a run killed at any point leaves a named set.
        self._state_file.write_text(
            json.dumps(
                {"owner": me.pid, "owner_started": me.create_time(), "namespaces": self.namespace_names}
            )
        )
        self._started = True
        (self.workdir / "links").mkdir(parents=True, exist_ok=True)
        try:
            self._namespace(self.core, forwarding=True)
            if self.probe_namespace:
                self._probe_host()
            for site in self.sites.values():
                self._site(site)
        except BaseException:
            self.close()
            raise
        return self

    def _namespace(self, name: str, forwarding: bool = False) -> None:
        ip(None, "netns", "add", name)
        ip(name, "link", "set", "lo", "up")
        # IPv6 off: its neighbour and router solicitations would be counted as traffic on every link.
        sysctl(name, "net.ipv6.conf.all.disable_ipv6", "1")
        sysctl(name, "net.ipv6.conf.default.disable_ipv6", "1")
        if forwarding:
            sysctl(name, "net.ipv4.ip_forward", "1")
        sysctl(name, "net.ipv4.tcp_rmem", f"4096 131072 {TCP_BUFFER_MAX}")
        sysctl(name, "net.ipv4.tcp_wmem", f"4096 16384 {TCP_BUFFER_MAX}")

    def _probe_host(self) -> None:
        ns = self.probe_namespace
        self._namespace(ns)
        ip(self.core, "link", "add", "probe0", "type", "veth", "peer", "name", "eth0", "netns", ns)
        ip(self.core, "addr", "add", f"{PROBE_NET}.1/24", "dev", "probe0")
        ip(ns, "addr", "add", f"{PROBE_HOST}/24", "dev", "eth0")
        ip(self.core, "link", "set", "probe0", "up")
        ip(ns, "link", "set", "eth0", "up")
        ip(ns, "route", "add", "default", "via", f"{PROBE_NET}.1")

    def _site(self, s: SiteNetwork) -> None:
        k, lan = s.index, s.address.rsplit(".", 1)[0]
        self._namespace(s.router, forwarding=True)
        self._namespace(s.namespace)
        ip(s.router, "link", "add", "lan0", "type", "veth", "peer", "name", "eth0", "netns", s.namespace)
        ip(s.router, "addr", "add", f"{lan}.1/24", "dev", "lan0")
        ip(s.namespace, "addr", "add", f"{s.address}/24", "dev", "eth0")
        ip(s.router, "link", "set", "lan0", "up")
        ip(s.namespace, "link", "set", "eth0", "up")
        ip(s.namespace, "route", "add", "default", "via", f"{lan}.1")
        # The access link: two TAP devices joined by the relay process.
        core_tap = f"s{k}"
        ip(s.router, "tuntap", "add", "mode", "tap", "name", "wan0")
        ip(self.core, "tuntap", "add", "mode", "tap", "name", core_tap)
        self._start_relay(s, core_tap)
        ip(s.router, "addr", "add", f"{WAN_NET}.{k}.2/24", "dev", "wan0")
        ip(self.core, "addr", "add", f"{WAN_NET}.{k}.1/24", "dev", core_tap)
        ip(s.router, "link", "set", "wan0", "up")
        ip(self.core, "link", "set", core_tap, "up")
        ip(s.router, "route", "add", "default", "via", f"{WAN_NET}.{k}.1")
        if k != 0:
            self._count_aggregator_traffic(s.router)
        if s.nat:
            self._nat(s.router)
        else:
            ip(self.core, "route", "add", f"{lan}.0/24", "via", f"{WAN_NET}.{k}.2")
        self._shape(s.router, "wan0", s.link.uplink_bps, s.link)
        self._shape(self.core, core_tap, s.link.downlink_bps, s.link)

    def _start_relay(self, s: SiteNetwork, core_tap: str) -> None:
        link = s.link
        argv = [
            sys.executable,
            "-m",
            "testbed.wan.relay",
            "--site",
            f"{s.router}:wan0",
            "--core",
            f"{self.core}:{core_tap}",
            "--delay",
            str(link.delay_ms),
            "--jitter",
            str(link.jitter_ms),
            "--loss",
            str(link.loss_pct),
            "--seed",
            str(self.scenario.seed * 1000 + s.index),
            "--stats",
            str(self.workdir / "links" / f"{s.name}.json"),
        ]
        log_path = self.workdir / "links" / f"{s.name}.log"
        with open(log_path, "w") as log:
            relay = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log, text=True)
        self._relays[s.name] = relay
        # The relay prints "ready" once both TAPs are attached.
        ready, _, _ = select.select([relay.stdout], [], [], 15.0)
        if not ready or relay.stdout.readline().strip() != "ready":
            relay.kill()
            relay.wait(5)
            err = log_path.read_text().strip().splitlines()
            raise TestbedError(
                f"the link relay of site {s.name} did not start: {err[-1] if err else 'no output'}"
            )

    @staticmethod
    def _shape(namespace: str, device: str, rate_bps: int | None, link: LinkProfile) -> None:
        """A token bucket on the device's egress: what may enter the wire, and how fast."""
        if rate_bps is None:
            return
        rate_bytes = rate_bps / 8
        burst = max(16 * 1024, int(rate_bytes * 0.002))
        # A queue of about one site-to-site round trip at this rate (a path crosses two access links,
        # each way): enough for one TCP flow to fill the link, as a home router's buffer lets it.
        limit = burst + max(64 * 1024, int(rate_bytes * max(0.05, 4 * link.delay_ms / 1000)))
        run(["tc", "-n", namespace, "qdisc", "add", "dev", device, "root", "tbf", "rate", f"{rate_bps}bit",
             "burst", str(burst), "limit", str(limit)])  # fmt: skip

    @staticmethod
    def _nat(router: str) -> None:
        """A home router: connections from the LAN go out under the router's address; nothing that
        the LAN did not start comes in."""
        rules = [
            ["-t", "nat", "-A", "POSTROUTING", "-o", "wan0", "-j", "MASQUERADE"],
            [
                "-A",
                "FORWARD",
                "-i",
                "wan0",
                "-m",
                "conntrack",
                "--ctstate",
                "ESTABLISHED,RELATED",
                "-j",
                "ACCEPT",
            ],
            ["-A", "FORWARD", "-i", "wan0", "-j", "DROP"],
            [
                "-A",
                "INPUT",
                "-i",
                "wan0",
                "-m",
                "conntrack",
                "--ctstate",
                "ESTABLISHED,RELATED",
                "-j",
                "ACCEPT",
            ],
            ["-A", "INPUT", "-i", "wan0", "-j", "DROP"],
        ]
        for rule in rules:
            run(in_namespace(router, ["iptables", "-w", "5", *rule]))

    def _count_aggregator_traffic(self, router: str) -> None:
        """Two counting rules (no verdict) ahead of everything else: what this site exchanges with the
        aggregator, so a run can tell the operator's share of the traffic from the swarm's own."""
        aggregator = self.sites[AGGREGATOR_SITE].address
        for rule in (["-o", "wan0", "-d", aggregator], ["-i", "wan0", "-s", aggregator]):
            run(in_namespace(router, ["iptables", "-w", "5", "-I", "FORWARD", "1", *rule]))

    def _aggregator_bytes(self, router: str) -> tuple[int, int]:
        aggregator = self.sites[AGGREGATOR_SITE].address
        listing = run(in_namespace(router, ["iptables", "-w", "5", "-L", "FORWARD", "-v", "-x", "-n"]))
        sent = received = 0
        for line in listing.splitlines():
            cols = line.split()
            # pkts bytes target prot opt in out source destination
            if len(cols) >= 8 and cols[0].isdigit() and cols[2] in ("all", "0"):
                if cols[5] == "wan0" and cols[7] == aggregator:
                    sent = int(cols[1])
                elif cols[4] == "wan0" and cols[6] == aggregator:
                    received = int(cols[1])
        return sent, received

    # ------------------------------------------------------------------ using it

    def popen(self, site: str, argv: list[str], **kwargs) -> subprocess.Popen:
        """Start ``argv`` inside ``site``'s LAN (its pid is the program's own: ``ip netns exec`` execs)."""
        return subprocess.Popen(in_namespace(self.sites[site].namespace, argv), **kwargs)

    def run_in(self, site: str, argv: list[str], timeout: float = 60.0) -> str:
        return run(in_namespace(self.sites[site].namespace, argv), timeout=timeout)

    def link_counters(self) -> dict[str, LinkCounters]:
        out = {}
        for s in self.sites.values():
            wan = json.loads(ip(s.router, "-s", "-j", "link", "show", "wan0"))[0]["stats64"]
            core_end = json.loads(ip(self.core, "-s", "-j", "link", "show", f"s{s.index}"))[0]["stats64"]
            relay = self._relay_stats(s.name)
            to_agg, from_agg = self._aggregator_bytes(s.router) if s.index != 0 else (0, 0)
            out[s.name] = LinkCounters(
                sent_bytes=wan["tx"]["bytes"],
                received_bytes=wan["rx"]["bytes"],
                sent_frames=wan["tx"]["packets"],
                received_frames=wan["rx"]["packets"],
                lost_up_frames=relay.get("up", {}).get("dropped_frames", 0),
                lost_down_frames=relay.get("down", {}).get("dropped_frames", 0),
                shaper_drops_up=self._qdisc_drops(s.router, "wan0"),
                shaper_drops_down=self._qdisc_drops(self.core, f"s{s.index}"),
                tap_drops_up=wan["tx"]["dropped"],
                tap_drops_down=core_end["tx"]["dropped"],
                to_aggregator_bytes=to_agg,
                from_aggregator_bytes=from_agg,
                **_lateness(relay),
            )
        return out

    def _relay_stats(self, site: str) -> dict:
        try:
            return json.loads((self.workdir / "links" / f"{site}.json").read_text())
        except (OSError, ValueError):
            return {}

    @staticmethod
    def _qdisc_drops(namespace: str, device: str) -> int:
        qdiscs = json.loads(run(["tc", "-n", namespace, "-s", "-j", "qdisc", "show", "dev", device]) or "[]")
        return sum(int(q.get("drops", 0)) for q in qdiscs)

    # ------------------------------------------------------------------ removing it

    def close(self) -> None:
        """Stop the relays and everything running in the namespaces, delete the namespaces. Bounded."""
        if not self._started:
            return
        for relay in self._relays.values():
            if relay.poll() is None:
                relay.terminate()
        deadline = time.monotonic() + 5
        for relay in self._relays.values():
            try:
                relay.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                relay.kill()
                relay.wait(5)
            if relay.stdout:
                relay.stdout.close()
        delete_namespaces(self.namespace_names)
        self._state_file.unlink(missing_ok=True)
        self._started = False

    def __enter__(self) -> EmulatedInternet:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()
