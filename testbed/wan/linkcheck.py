"""``manta-swarm --check-links``: does each emulated access link do what it was configured to do?

For every site, between a process in the site's LAN and a measurement host on the core (reached by
an unshaped link, so exactly that site's access link is crossed), it measures:

- the round trip (UDP echo; configured: twice the one-way delay), within 10 % or 2 ms;
- loss each way (numbered UDP datagrams, paced at half the link's rate so that the rate limiter
  drops none; enough of them that a quarter of the configured share is two standard deviations),
  within a quarter of the configured share;
- the rate each way (a bulk TCP transfer; the rate is read off the receiving interface's counters
  over the second half of the transfer, after TCP's start-up), within 10 %. Over a lossy link TCP
  may not fill the link (a flow is held near MSS / RTT * 1.22 / sqrt(loss)); a row that falls short
  where that bound is below the rate is shown, not judged.

On a virtual machine the host may run other guests on this machine's cores ("steal" in
``/proc/stat``); the relays and shapers then stop for milliseconds at a time. A rate or round trip off
its setting while the host took more than 5 % of the CPU time is shown, not judged: measure again.

The site always opens the connections, so NAT sites are measured the same way.
"""

from __future__ import annotations

import json
import math
import select
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from testbed.wan.netns import TestbedError, in_namespace
from testbed.wan.rates import format_rate
from testbed.wan.scenario import Scenario, SiteSpec
from testbed.wan.topology import PROBE_HOST, EmulatedInternet, LinkCounters, SiteNetwork

RATE_TOLERANCE = 0.10
RTT_TOLERANCE, RTT_SLACK_MS = 0.10, 2.0
LOSS_TOLERANCE = 0.25
MSS_BYTES = 1448
PROBES_PER_SECOND = 5000
HOST_STEAL_LIMIT = 0.05  # share of this machine's CPU time the host may take while a link is judged


@dataclass(frozen=True)
class CheckRow:
    site: str
    quantity: str
    configured: str
    measured: str
    ok: bool | None  # None: shown, not judged
    note: str = ""

    @property
    def verdict(self) -> str:
        return {True: "ok", False: "OFF", None: "-"}[self.ok]


def _probe(*args: str) -> list[str]:
    return [sys.executable, "-m", "testbed.wan.probe", *args]


class _Pair:
    """Runs one probe on the measurement host and one in a site's LAN at the same time; returns both
    JSON results."""

    def __init__(self, net: EmulatedInternet, site: SiteNetwork):
        if net.probe_namespace is None:
            raise TestbedError(
                "link checks need the measurement host: EmulatedInternet(..., probe_host=True)"
            )
        self.net, self.site = net, site
        self.server_ip = PROBE_HOST

    def run(self, server_args: list[str], site_args: list[str], timeout: float) -> tuple[dict, dict]:
        server = subprocess.Popen(
            in_namespace(self.net.probe_namespace, _probe(*server_args)),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            ready, _, _ = select.select([server.stderr], [], [], 15.0)
            if not ready or server.stderr.readline().strip() != "ready":
                raise TestbedError("a link probe on the measurement host did not start within 15 s")
            site_out = self.net.run_in(self.site.name, _probe(*site_args), timeout=timeout)
            server_out, server_err = server.communicate(timeout=timeout)
        finally:
            if server.poll() is None:
                server.kill()
                server.wait(5)
        if server.returncode != 0:
            raise TestbedError(
                f"a link probe failed on the measurement host: {server_err.strip().splitlines()[-1:]}"
            )
        return json.loads(server_out), json.loads(site_out)


class HostSteal:
    """The share of this machine's CPU time the host gave to others ("steal") between construction
    and :meth:`share` (0 where ``/proc/stat`` has no such column)."""

    def __init__(self) -> None:
        self._start = self._read()

    @staticmethod
    def _read() -> tuple[int, int]:
        try:
            fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        except (OSError, ValueError):
            return 0, 0
        # user nice system idle iowait irq softirq steal [guest guest_nice: already in user and nice]
        return (fields[7] if len(fields) > 7 else 0), sum(fields[:8])

    def share(self) -> float:
        steal, total = self._read()
        elapsed = total - self._start[1]
        return (steal - self._start[0]) / elapsed if elapsed > 0 else 0.0


def judged_under_steal(row: CheckRow, share: float) -> CheckRow:
    """``row`` unjudged, with a note, when it is off while the host took more than HOST_STEAL_LIMIT of
    this machine's CPU time (``share``)."""
    if row.ok is not False or share <= HOST_STEAL_LIMIT:
        return row
    note = (
        f"the host took {100 * share:.0f} % of this machine's CPU time during the measurement "
        f"(steal), so the link's timing is not judged: measure again"
    )
    return replace(row, ok=None, note="; ".join(filter(None, (note, row.note))))


def _within(measured: float, configured: float, tolerance: float, slack: float = 0.0) -> bool:
    return abs(measured - configured) <= max(tolerance * configured, slack)


def check_round_trip(pair: _Pair, spec: SiteSpec) -> CheckRow:
    port = f"{pair.server_ip}:7001"
    _, out = pair.run(
        ["echo", "--listen", port, "--seconds", "8"],
        ["rtt", "--connect", port, "--count", "150", "--interval", "0.02"],
        timeout=30,
    )
    configured = 2 * spec.link.delay_ms
    if not out.get("received"):
        return CheckRow(spec.name, "round trip", f"{configured:.1f} ms", "no answer", False)
    measured = out["median_ms"]
    return CheckRow(
        spec.name,
        "round trip",
        f"{configured:.1f} ms" + (f" +- {2 * spec.link.jitter_ms:.1f}" if spec.link.jitter_ms else ""),
        f"{measured:.1f} ms median (p10 {out['p10_ms']:.1f}, p90 {out['p90_ms']:.1f}; {out['received']}/{out['sent']})",
        _within(measured, configured, RTT_TOLERANCE, RTT_SLACK_MS),
    )


def _loss_probes(loss_pct: float) -> int:
    p = loss_pct / 100
    # 2 sigma of the binomial estimate equal to a quarter of p: n = 64 (1 - p) / p
    return 2000 if p <= 0 else int(min(100_000, max(2000, math.ceil(64 * (1 - p) / p))))


def check_loss(pair: _Pair, spec: SiteSpec, direction: str) -> CheckRow:
    link = spec.link
    rate = (link.uplink_bps if direction == "up" else link.downlink_bps) or 100_000_000
    n = _loss_probes(link.loss_pct)
    size = 100
    # Half the link's rate (the shaper drops nothing) and at most 5,000 datagrams/s (what one Python
    # receiver takes without falling behind).
    pace = min(rate / 2, PROBES_PER_SECOND * size * 8)
    seconds = str(n * size * 8 / pace + 10)
    port = f"{pair.server_ip}:7002"
    common = ["--count", str(n), "--rate", str(pace), "--size", str(size), "--seconds", seconds]
    if direction == "up":
        server, _ = pair.run(["count", "--listen", port, *common], ["blast", "--connect", port, *common], 120)
        result = server
    else:
        _, site = pair.run(["blast", "--listen", port, *common], ["count", "--connect", port, *common], 120)
        result = site
    measured = 100 * (1 - result["received"] / n)
    return CheckRow(
        spec.name,
        f"{direction}link loss",
        f"{link.loss_pct:g} %",
        f"{measured:.3f} % ({n - result['received']} of {n} datagrams)",
        abs(measured - link.loss_pct) <= LOSS_TOLERANCE * link.loss_pct if link.loss_pct else measured == 0,
    )


def check_rate(pair: _Pair, spec: SiteSpec, direction: str) -> CheckRow:
    link = spec.link
    configured = link.uplink_bps if direction == "up" else link.downlink_bps
    rtt_s = 2 * link.delay_ms / 1000
    seconds = max(6.0, 30 * rtt_s)
    port = f"{pair.server_ip}:7003"
    before = pair.net.link_counters()[spec.name]
    if direction == "up":  # the site sends, the measurement host receives
        server, sender = pair.run(
            ["recv", "--listen", port, "--device", "eth0"],
            ["send", "--connect", port, "--seconds", str(seconds)],
            timeout=seconds + 60,
        )
        samples = server["samples"]
    else:
        sender, site = pair.run(
            ["send", "--listen", port, "--seconds", str(seconds)],
            ["recv", "--connect", port, "--device", "eth0"],
            timeout=seconds + 60,
        )
        samples = site["samples"]
    after = pair.net.link_counters()[spec.name]
    why = _flow_and_link(sender, before, after, direction)
    # the second half of the transfer: TCP's slow start is over
    half = samples[-1][0] / 2
    first = next(s for s in samples if s[0] >= half)
    last = samples[-1]
    dt = last[0] - first[0]
    wire = (last[2] - first[2]) * 8 / dt
    goodput = (last[1] - first[1]) * 8 / dt
    measured = f"{format_rate(wire)} on the wire (TCP goodput {format_rate(goodput)})"
    if configured is None:
        return CheckRow(spec.name, f"{direction}link rate", "not shaped", measured, None)
    ok = _within(wire, configured, RATE_TOLERANCE)
    if not ok and link.loss_pct > 0:
        bound = MSS_BYTES * 8 / max(rtt_s, 1e-3) * 1.22 / math.sqrt(link.loss_pct / 100)
        if bound < configured:  # TCP itself, not the link, may be what falls short: shown, not judged
            return CheckRow(
                spec.name,
                f"{direction}link rate",
                format_rate(configured),
                measured,
                None,
                note=f"one TCP flow over {link.loss_pct:g} % loss and {2 * link.delay_ms:g} ms may be held near "
                f"{format_rate(bound)} (Mathis et al.); check the rate with --loss 0; {why}",
            )
    return CheckRow(
        spec.name, f"{direction}link rate", format_rate(configured), measured, ok, "" if ok else why
    )


def _flow_and_link(sender: dict, before: LinkCounters, after: LinkCounters, direction: str) -> str:
    """What the sender and the link saw during a rate transfer, for a row that fell short."""
    shaper, tap = (
        ("shaper_drops_up", "tap_drops_up") if direction == "up" else ("shaper_drops_down", "tap_drops_down")
    )
    return (
        f"sender: {sender.get('retransmitted', '?')} segments retransmitted, smoothed round trip "
        f"{sender.get('srtt_ms', 0):.1f} ms, window {sender.get('cwnd', '?')} segments; link: "
        f"{getattr(after, shaper) - getattr(before, shaper)} dropped by the shaper's full queue, "
        f"{getattr(after, tap) - getattr(before, tap)} by the TAP (relay behind), "
        f"{after.late_over_5ms_frames - before.late_over_5ms_frames} frames >5 ms late (worst {after.late_ms_max:.1f} ms)"
    )


QUANTITIES = ("round trip", "uplink loss", "downlink loss", "uplink rate", "downlink rate")
TIMED_QUANTITIES = ("round trip", "uplink rate", "downlink rate")  # what host steal can put off


def check_site_link(
    net: EmulatedInternet,
    spec: SiteSpec,
    quantities: tuple[str, ...] = QUANTITIES,
    progress: Callable[[str], None] = print,
) -> list[CheckRow]:
    """Measure ``quantities`` of one site's access link on a running emulated internet."""
    pair = _Pair(net, net.sites[spec.name])
    steps = {
        "round trip": (check_round_trip, ()),
        "uplink loss": (check_loss, ("up",)),
        "downlink loss": (check_loss, ("down",)),
        "uplink rate": (check_rate, ("up",)),
        "downlink rate": (check_rate, ("down",)),
    }
    rows = []
    for what in quantities:
        step, args = steps[what]
        progress(f"{spec.name}: measuring {what} ...")
        steal = HostSteal()
        row = step(pair, spec, *args)
        rows.append(judged_under_steal(row, steal.share()) if what in TIMED_QUANTITIES else row)
    return rows


def check_links(scenario: Scenario, workdir: Path, progress: Callable[[str], None] = print) -> list[CheckRow]:
    """Build the scenario's network and measure every site's link; the network is removed after."""
    with EmulatedInternet(scenario, workdir, probe_host=True) as net:
        return [row for spec in scenario.sites for row in check_site_link(net, spec, progress=progress)]


def format_rows(rows: list[CheckRow]) -> str:
    header = ("site", "quantity", "configured", "measured", "verdict")
    table = [header] + [(r.site, r.quantity, r.configured, r.measured, r.verdict) for r in rows]
    widths = [max(len(str(line[i])) for line in table) for i in range(len(header))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(line, widths)).rstrip() for line in table]
    lines += [f"  note ({r.site}, {r.quantity}): {r.note}" for r in rows if r.note]
    return "\n".join(lines)
