"""Figures of a finished local swarm, from what its processes wrote and what crossed its links.

Per peer: its site, how it ended (finished, killed with kill -9, stopped with Ctrl-C, failed),
rounds committed and aborted with their reasons, compute utilization (time in its own mini-batches
over the span from its first round's start to its last round's end), time per stage, and the time
from its start to its first committed contribution. For the swarm: the same summed, distinct
committed rounds, the coordination each peer sent per round (DHT requests and replies, matchmaking's
join messages), and, on an emulated internet, the bytes each site's access link carried (the
kernel's counters of the link itself) and wide-area bytes per training sample.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from testbed.wan.topology import AGGREGATOR_SITE, LinkCounters

STAGES = (
    "compute",
    "cohort",
    "cross",
    "broadcast",
    "commit",
    "outer",
    "roster",
    "commitments",
    "apply",
    "publish",
    "other",
    "between",
)
_PEER_ID = re.compile(r"\b(Qm|12D3Koo)[1-9A-HJ-NP-Za-km-z]{20,}")


@dataclass
class PeerFigures:
    name: str
    site: str | None
    joiner: bool  # started after the swarm's first committed round
    ended: str  # finished | killed (kill -9) | interrupted (Ctrl-C) | stopped | failed | running
    started: float  # wall time (s since the epoch)
    rounds_committed: int = 0
    rounds_aborted: int = 0
    rounds_committed_late: int = 0  # of rounds_committed: aborted here first, committed once a quorum showed
    rounds_aborted_leaving: int = (
        0  # of rounds_aborted: ended after the peer was told to stop (Ctrl-C, SIGTERM)
    )
    abort_reasons: dict[str, int] = field(default_factory=dict)
    samples: int = 0
    outer_steps_committed: int = 0  # sync = "outer": outer steps this peer took
    cross_cohort_bytes: int = 0  # payload bytes its all-reduces moved across cohorts (its own count)
    rounds_reported: int = 0  # its rounds.jsonl lines, committed or not
    control_messages: int = 0  # coordination it sent over those rounds (hivemind_adapter.control_traffic)
    control_bytes: int = 0
    outer_steps_aborted: int = 0
    # attempt -> the outer state (global parameters and momentum) after each outer step it took
    outer_states: dict[str, str] = field(default_factory=dict)
    compute_utilization: float | None = None
    span_s: float = 0.0  # from its first round's start to its last round's end
    stages_s: dict[str, float] = field(default_factory=dict)
    first_contribution_s: float | None = None  # from its start to its first committed contribution
    lived_s: float | None = None  # from its start until it was signalled or exited (None: still running)


@dataclass
class SiteFigures:
    name: str
    peers: list[str]
    nat: bool
    link: dict[str, Any]  # as configured
    sent_bytes: int
    received_bytes: int
    lost_frames: int
    shaper_drops: int
    to_aggregator_bytes: int = 0  # the part of sent/received exchanged with the aggregator's site
    from_aggregator_bytes: int = 0
    late_ms_mean: float = 0.0  # the emulated delay's accuracy under the run's load (see testbed.wan.relay)
    late_ms_max: float = 0.0
    late_over_5ms_frames: int = 0


def process_events(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / "processes.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def read_rounds(folder: Path, file: str = "rounds.jsonl") -> list[dict]:
    """A peer's ``rounds.jsonl`` (or another of its JSON-lines files), lines cut short skipped."""
    path = folder / file
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            pass
    return out


def _reason(text: str) -> str:
    """An abort reason with peer ids taken out, so the same cause counts as one."""
    return _PEER_ID.sub("<peer>", text or "unknown")[:160]


def _ending(events: list[dict]) -> str:
    signals = [e["event"] for e in events if e["event"].startswith("signal-")]
    exit_ = next((e for e in reversed(events) if e["event"] == "exit"), None)
    if exit_ is None:
        return "running"
    if "signal-kill" in signals:
        return "killed"
    if "signal-int" in signals:
        return "interrupted"
    if "signal-term" in signals:
        return "stopped"
    return "finished" if exit_.get("returncode") == 0 else "failed"


def peer_figures(run_dir: Path) -> list[PeerFigures]:
    events = process_events(run_dir)
    by_name: dict[str, list[dict]] = {}
    for e in events:
        by_name.setdefault(e["name"], []).append(e)
    rounds_by_peer = {name: read_rounds(Path(run_dir) / name) for name in by_name if name.startswith("peer-")}
    first_commit = min(
        (r["time"] for rs in rounds_by_peer.values() for r in rs if r.get("committed")), default=float("inf")
    )
    out = []
    for name, rounds in rounds_by_peer.items():
        evs = by_name[name]
        started = next(e["time"] for e in evs if e["event"] == "start")
        fig = PeerFigures(name, evs[0].get("site"), started > first_commit, _ending(evs), started)
        committed = [r for r in rounds if r.get("committed")]
        # A round that ended aborted and committed later (its result found a quorum after all) has two
        # lines, the second "late": it counts once, as committed.
        late = {r.get("attempt") for r in committed if r.get("late")}
        aborted = [r for r in rounds if not r.get("committed") and r.get("attempt") not in late]
        fig.rounds_committed = len(committed)
        fig.rounds_committed_late = len(late)
        fig.rounds_aborted = len(aborted)
        # The run's end (or a volunteer's Ctrl-C) asks a peer to finish its round and leave; a round
        # whose partners had already left ends aborted. Counted apart from the rounds churn broke.
        told = min((e["time"] for e in evs if e["event"] in ("signal-term", "signal-int")), default=None)
        fig.rounds_aborted_leaving = sum(1 for r in aborted if told is not None and r["time"] >= told)
        fig.abort_reasons = dict(Counter(_reason(r.get("reason", "")) for r in aborted))
        fig.samples = sum(r["samples"] for r in committed)
        fig.cross_cohort_bytes = max((r.get("cross_cohort_bytes", 0) for r in rounds), default=0)
        fig.rounds_reported = len(rounds)
        fig.control_messages = sum(r.get("control_messages", 0) for r in rounds)
        fig.control_bytes = sum(r.get("control_bytes", 0) for r in rounds)
        outer = read_rounds(Path(run_dir) / name, "outer.jsonl")
        fig.outer_steps_committed = sum(1 for o in outer if o["committed"])
        fig.outer_steps_aborted = len(outer) - fig.outer_steps_committed
        fig.outer_states = {str(o["attempt"]): o["outer_digest"] for o in outer if o["committed"]}
        stages = dict.fromkeys(STAGES, 0.0)
        for r in rounds:
            split = r.get("stages") or {
                "compute": r["times"]["compute"],
                "other": r["seconds"] - r["times"]["compute"],
            }
            for k in STAGES:
                stages[k] += split.get(k, 0.0)
        fig.stages_s = {k: round(v, 2) for k, v in stages.items()}
        if rounds:
            span = rounds[-1]["time"] - (rounds[0]["time"] - rounds[0]["seconds"])
            fig.span_s = round(span, 2)
            fig.compute_utilization = round(stages["compute"] / span, 4) if span > 0 else None
        # Until it was told to stop or killed: a peer asked to leave has no more rounds to show.
        end = next((e for e in evs if e["event"].startswith("signal-") or e["event"] == "exit"), None)
        fig.lived_s = round(end["time"] - started, 1) if end is not None else None
        contributed = [r for r in committed if r["samples"] > 0]
        if contributed:
            fig.first_contribution_s = round(contributed[0]["time"] - started, 1)
        out.append(fig)
    return sorted(out, key=lambda f: int(f.name.split("-")[1]))


def site_figures(
    counters: dict[str, LinkCounters], configured: dict[str, dict], placement: dict[str, str | None]
) -> list[SiteFigures]:
    out = []
    for site, c in counters.items():
        out.append(
            SiteFigures(
                name=site,
                peers=sorted(p for p, s in placement.items() if s == site),
                nat=configured[site]["nat"],
                link=configured[site]["link"],
                sent_bytes=c.sent_bytes,
                received_bytes=c.received_bytes,
                lost_frames=c.lost_up_frames + c.lost_down_frames,
                shaper_drops=c.shaper_drops_up + c.shaper_drops_down,
                to_aggregator_bytes=c.to_aggregator_bytes,
                from_aggregator_bytes=c.from_aggregator_bytes,
                late_ms_mean=c.late_ms_mean,
                late_ms_max=c.late_ms_max,
                late_over_5ms_frames=c.late_over_5ms_frames,
            )
        )
    return out


def swarm_figures(
    peers: list[PeerFigures], sites: list[SiteFigures] | None, total_samples: int
) -> dict[str, Any]:
    stages = {k: round(sum(p.stages_s.get(k, 0.0) for p in peers), 2) for k in STAGES}
    span = sum(p.span_s for p in peers)
    reported = sum(p.rounds_reported for p in peers)
    reasons: Counter = Counter()
    for p in peers:
        reasons.update(p.abort_reasons)
    out: dict[str, Any] = {
        "compute_utilization": round(stages["compute"] / span, 4) if span else None,
        "stages_s": stages,
        "peer_rounds_committed": sum(p.rounds_committed for p in peers),
        "peer_rounds_aborted": sum(p.rounds_aborted for p in peers),
        "peer_rounds_committed_late": sum(p.rounds_committed_late for p in peers),
        "peer_rounds_aborted_leaving": sum(p.rounds_aborted_leaving for p in peers),
        # sync = "outer": outer steps any peer took, and peer-steps that aborted
        "outer_steps": len({a for p in peers for a in p.outer_states}),
        "peer_outer_steps_aborted": sum(p.outer_steps_aborted for p in peers),
        # every peer that took an outer step holds the same outer state after it (None: no outer steps)
        "identical_outer_states": _identical_outer_states(peers),
        # what the peers' all-reduces moved across cohorts, as they counted it (payload bytes, both ways)
        "cross_cohort_bytes": sum(p.cross_cohort_bytes for p in peers),
        "cross_cohort_bytes_per_sample": round(sum(p.cross_cohort_bytes for p in peers) / total_samples)
        if total_samples
        else None,
        # coordination (DHT requests and replies, matchmaking's join messages) each peer sent per round
        # it reported: protobuf payload, the mean over peers' rounds (None: no round reported)
        "control_bytes_per_peer_round": round(sum(p.control_bytes for p in peers) / reported)
        if reported
        else None,
        "control_messages_per_peer_round": round(sum(p.control_messages for p in peers) / reported, 1)
        if reported
        else None,
        "abort_reasons": dict(reasons.most_common()),
        "joiners": {p.name: p.first_contribution_s for p in peers if p.joiner},
        # How long each joiner ran: one killed (churn) before it could contribute says nothing of joining.
        "joiners_lived_s": {p.name: p.lived_s for p in peers if p.joiner},
    }
    if sites is not None:
        wan = sum(s.sent_bytes for s in sites)
        peer_sites = sum(s.sent_bytes for s in sites if s.name != AGGREGATOR_SITE)
        out["wan_bytes"] = wan
        out["wan_bytes_with_aggregator"] = sum(s.to_aggregator_bytes + s.from_aggregator_bytes for s in sites)
        out["wan_bytes_peer_sites"] = peer_sites
        # what the peer sites sent each other: training traffic and DHT coordination, not the
        # aggregator's checkpoint and audit downloads
        out["wan_bytes_between_peer_sites"] = sum(
            s.sent_bytes - s.to_aggregator_bytes for s in sites if s.name != AGGREGATOR_SITE
        )
        out["wan_bytes_per_sample"] = round(wan / total_samples) if total_samples else None
        out["wan_bytes_per_sample_peer_sites"] = round(peer_sites / total_samples) if total_samples else None
    return out


def as_json(items: list) -> list[dict]:
    return [asdict(x) for x in items]


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f}"


def _identical_outer_states(peers: list[PeerFigures]) -> bool | None:
    by_attempt: dict[str, set[str]] = {}
    for p in peers:
        for attempt, state in p.outer_states.items():
            by_attempt.setdefault(attempt, set()).add(state)
    return all(len(s) == 1 for s in by_attempt.values()) if by_attempt else None


def format_tables(peers: list[PeerFigures], sites: list[SiteFigures] | None, swarm: dict[str, Any]) -> str:
    """The printed table: one row per peer, one per site link, and the swarm's line."""
    rows = [("peer", "site", "ended", "committed", "aborted", "samples", "compute", "cohort s", "cross s",
             "bcast s", "commit s", "outer s", "roster s", "commit to s", "apply s", "publish s", "other s",
             "between s", "1st contrib s")]  # fmt: skip
    for p in peers:
        s = p.stages_s
        rows.append(
            (
                p.name + (" (joined)" if p.joiner else ""),
                p.site or "loopback",
                p.ended,
                str(p.rounds_committed),
                str(p.rounds_aborted),
                str(p.samples),
                f"{100 * p.compute_utilization:.0f} %" if p.compute_utilization is not None else "-",
                *(f"{s.get(k, 0.0):.0f}" for k in STAGES[1:]),
                f"{p.first_contribution_s:.0f}" if p.first_contribution_s is not None else "-",
            )
        )
    text = [_table(rows)]
    if sites is not None:
        rows = [("site", "peers", "link", "sent MB", "received MB", "of which aggregator MB", "lost frames",
                 "shaper drops", "delay late ms mean/max")]  # fmt: skip
        for s in sites:
            link = s.link
            desc = (
                f"{link['uplink']}/{link['downlink']} {link['delay_ms']:g} ms"
                + (f" {link['loss_pct']:g} % loss" if link["loss_pct"] else "")
                + (" NAT" if s.nat else "")
            )
            aggregator = (
                "-"
                if s.name == AGGREGATOR_SITE
                else f"{_mb(s.to_aggregator_bytes)} / {_mb(s.from_aggregator_bytes)}"
            )
            rows.append((s.name, ",".join(s.peers) or "-", desc, _mb(s.sent_bytes), _mb(s.received_bytes),
                         aggregator, str(s.lost_frames), str(s.shaper_drops),
                         f"{s.late_ms_mean:.2f} / {s.late_ms_max:.1f}"))  # fmt: skip
        text.append(_table(rows))
    line = (
        f"swarm: compute utilization {100 * (swarm['compute_utilization'] or 0):.0f} %, "
        f"{swarm['peer_rounds_committed']} peer-rounds committed, {swarm['peer_rounds_aborted']} aborted "
        f"({swarm['peer_rounds_aborted_leaving']} while leaving)"
    )
    if swarm.get("control_bytes_per_peer_round") is not None:
        line += (
            f"; coordination sent per peer per round: {swarm['control_bytes_per_peer_round'] / 1e3:.1f} KB "
            f"in {swarm['control_messages_per_peer_round']:.0f} messages"
        )
    if swarm.get("outer_steps"):
        line += (
            f", {swarm['outer_steps']} outer step(s) ({swarm['peer_outer_steps_aborted']} peer-steps aborted; "
            f"one outer state after each: {swarm['identical_outer_states']})"
        )
    if "wan_bytes" in swarm:
        per = swarm["wan_bytes_per_sample"]
        line += f"; wide-area {_mb(swarm['wan_bytes'])} MB sent" + (
            f", {per / 1e3:.1f} KB per training sample" if per else ""
        )
    text.append(line)
    if swarm["abort_reasons"]:
        text.append("aborts: " + "; ".join(f"{n}x {r}" for r, n in list(swarm["abort_reasons"].items())[:5]))
    return "\n\n".join(text)


def _table(rows: list[tuple]) -> str:
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)
