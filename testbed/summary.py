"""What a finished local swarm did, from the files its processes left (``manta-swarm --summary``).

Everything comes from the peers' own records (``rounds.jsonl``, ``final-state.pt``), the runner's
process log (``processes.jsonl``) and, on an emulated internet, the links' own counters, not from
estimates, so the summary reports what the processes and the wire actually did:

- ``rounds``: rounds committed by the swarm (distinct round numbers any peer committed);
- ``total_samples``: samples the swarm processed in those rounds (each round's contributor sum);
- ``samples_per_peer`` and ``time_split`` per peer (compute / averaging / other, seconds);
- ``final_digests``: the final state digest of every peer that finished the run;
  ``identical_final_state`` whether they agree (peers killed on the way are listed apart);
- ``peers``, ``swarm`` and ``sites``: the figures of :mod:`testbed.figures` (how each peer ended,
  rounds committed and aborted with reasons, compute utilization, time per stage, time to the first
  committed contribution; bytes over each site's access link, wide-area bytes per sample);
- ``ledger`` (path, size, root, latest checkpoint note) and ``credits`` per peer (training FLOPs,
  share, entries, revoked) from the aggregator's contribution ledger;
- ``accuracy`` (classification) or ``epe`` (stereo): ``{"largest": ..., "smallest": ...}`` on the
  validation split, measured on a peer's final state after BN recalibration.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from ledger.errors import LedgerError
from ledger.rewards import compute_rewards
from ledger.store import LedgerStore
from protocol.identity import Identity
from supernet.checkpoint import CheckpointError, load_checkpoint, read_checkpoint
from tasks.shards.local import DATA_SPEC_FILE, open_shard_directory
from testbed.figures import as_json, peer_figures, site_figures, swarm_figures
from testbed.local_swarm import LocalSwarm
from testbed.wan.rates import format_rate
from testbed.wan.topology import LinkCounters

logger = logging.getLogger("manta.swarm")


def progress_line(swarm: LocalSwarm, total_rounds: int) -> tuple[int, str] | None:
    """The newest round any peer committed and one line describing it (None before the first)."""
    newest: dict[str, Any] | None = None
    cohorts = set()
    for name in swarm.peer_names():
        reports = swarm.rounds(name)
        committed = [r for r in reports if r["committed"]]
        if committed:
            last = committed[-1]
            if newest is None or last["round"] > newest["round"]:
                newest = last
        if reports and swarm.procs[name].poll() is None:
            cohorts.add(reports[-1]["cohort"])
    if newest is None:
        return None
    rate = newest["swarm_samples"] / max(newest["seconds"], 1e-6)
    return newest["round"], (
        f"round {newest['round'] + 1:>4}/{total_rounds}  loss {newest['loss']:.4f}  "
        f"{newest['swarm_samples']} samples at {rate:.0f}/s  {newest['contributors']} contributor(s) in "
        f"{len(cohorts)} cohort(s), {len(swarm.running_peers())} peer(s) running  phase {newest['phase']}"
    )


def summarise(
    swarm: LocalSwarm,
    wall_seconds: float,
    evaluate: bool = True,
    link_counters: dict[str, LinkCounters] | None = None,
) -> dict[str, Any]:
    # round -> the samples its committed result covers, by the scope that committed it: the swarm
    # (every-step) or each cohort (an outer task's inner steps: the round's samples are the cohorts' sum)
    committed_rounds: dict[int, dict[str, int]] = {}
    by_cohort = swarm.o.sync == "outer"
    samples_per_peer, time_split, digests, killed = {}, {}, {}, {}
    for name in swarm.peer_names():
        reports = [r for r in swarm.rounds(name) if r["committed"]]
        for r in reports:
            scope = committed_rounds.setdefault(r["round"], {})
            key = r["cohort"] if by_cohort else ""
            scope[key] = max(scope.get(key, 0), r["swarm_samples"])
        samples_per_peer[name] = sum(r["samples"] for r in reports)
        split = {"compute": 0.0, "averaging": 0.0, "other": 0.0}
        for r in reports:
            split["compute"] += r["times"]["compute"]
            split["averaging"] += r["times"]["averaging"]
            split["other"] += r["times"]["waiting"]
        time_split[name] = {k: round(v, 2) for k, v in split.items()}
        if swarm.procs[name].returncode == 0:
            # Only a peer that ran to the end holds the run's final state: the one it saved (a peer
            # leaving may catch up after its last round), or else its last committed round's.
            saved = saved_digest(swarm.dir / name / "final-state.pt")
            if saved or reports:
                digests[name] = saved or reports[-1]["state_digest"]
        elif reports:
            killed[name] = reports[-1]["state_digest"]  # one killed on the way holds what it had then
    total_samples = sum(sum(scope.values()) for scope in committed_rounds.values())
    peers = peer_figures(swarm.dir)
    sites = None
    if link_counters is not None and swarm.internet is not None:
        configured = {
            name: {
                "nat": net.nat,
                "link": {
                    "uplink": format_rate(net.link.uplink_bps) if net.link.uplink_bps else "unshaped",
                    "downlink": format_rate(net.link.downlink_bps) if net.link.downlink_bps else "unshaped",
                    "delay_ms": net.link.delay_ms,
                    "jitter_ms": net.link.jitter_ms,
                    "loss_pct": net.link.loss_pct,
                },
            }
            for name, net in swarm.internet.sites.items()
        }
        sites = site_figures(link_counters, configured, swarm.sites)
    summary: dict[str, Any] = {
        "task": swarm.o.task,
        "mode": swarm.o.mode,
        "peers": swarm.o.peers,
        "cohorts": swarm.o.cohorts,
        "rounds": len(committed_rounds),
        "total_samples": total_samples,
        "wall_time_s": round(wall_seconds, 1),
        "samples_per_peer": samples_per_peer,
        "time_split_s": time_split,
        "final_digests": digests,
        "identical_final_state": len(set(digests.values())) == 1 if digests else False,
        "peers_stopped_early": killed,
        "run_dir": str(swarm.dir.resolve()),
        "peers_detail": as_json(peers),
        "swarm": swarm_figures(peers, sites, total_samples),
        "sites": as_json(sites) if sites is not None else None,
        **ledger_summary(swarm),
    }
    if evaluate:
        summary.update(evaluate_final_state(swarm))
    return summary


def ledger_summary(swarm: LocalSwarm) -> dict[str, Any]:
    """The aggregator's ledger (path, size, root, checkpoint) and each peer's credits in it."""

    path = swarm.dir / "aggregator" / "ledger.sqlite"
    if not path.exists():
        return {"ledger": None, "credits": {}}
    try:
        with LedgerStore.open(path, readonly=True) as store:
            head = store.latest_checkpoint()
            rewards = compute_rewards((d for _, d in store.entries()), store.log_public_key)
            ledger = {
                "path": str(path.resolve()),
                "size": store.size,
                "root": store.root().hex(),
                "checkpoint": head.note if head else None,
            }
    except (LedgerError, ValueError) as e:
        return {"ledger": {"path": str(path.resolve()), "error": str(e)}, "credits": {}}
    by_key = {p.public_key: p for p in rewards.peers}
    credits = {}
    for name in swarm.peer_names():
        key_file = swarm.dir / name / "identity.key"
        if key_file.exists():
            reward = by_key.get(Identity.load(key_file).public_key_hex)
            credits[name] = {
                "credits": reward.credits if reward else 0,
                "share": round(reward.share, 4) if reward else 0.0,
                "entries": reward.entries if reward else 0,
                "revoked": reward.revoked if reward else 0,
            }
    return {"ledger": ledger, "credits": credits}


def saved_digest(path: Path) -> str:
    """The state digest recorded in a peer's final checkpoint ("" if it saved none, or none readable)."""
    if not path.exists():
        return ""
    try:
        return str(read_checkpoint(path)["digest"])
    except CheckpointError as e:
        logger.warning(str(e))
        return ""


def evaluate_final_state(swarm: LocalSwarm) -> dict[str, Any]:
    """Largest and smallest sub-network quality of the newest final state any peer saved."""

    candidates = [swarm.dir / name / "final-state.pt" for name in swarm.peer_names()]
    candidates = [p for p in candidates if p.exists()]
    if not candidates:
        return {"evaluation_error": "no peer saved a final state"}
    best = None
    shard_task = _shard_task(swarm)
    for path in candidates:
        try:
            loaded = load_checkpoint(path, task=best.workload.task if best else shard_task)
        except CheckpointError as e:
            logger.warning(str(e))
            continue
        if best is None or loaded.round > best.round:
            best = loaded
    if best is None:
        return {"evaluation_error": "no final state could be loaded"}
    net, workload = best.net, best.workload
    rows = workload.evaluate(net, {"largest": net.largest_config(), "smallest": net.smallest_config()})
    key = "accuracy" if workload.family == "classification" else workload.metric_name
    return {
        key: {row["name"]: round(float(row[workload.metric_name]), 4) for row in rows},
        "evaluated_round": best.round,
    }


def _shard_task(swarm: LocalSwarm):
    """A task on an operator's dataset: the task read from the aggregator's packed shards (its
    validation split is what the final state is evaluated on); None for built-in data."""
    packed = swarm.dir / "aggregator" / "data"
    return open_shard_directory(packed) if (packed / DATA_SPEC_FILE).is_file() else None


def write_summary(summary: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary, indent=2) + "\n")
