"""``/metrics``: the monitor's figures in the Prometheus text exposition format (version 0.0.4).

Every metric is named ``manta_*`` and rendered from the same dictionaries the JSON API returns, so a
scrape and ``/api/status`` never disagree. Per-peer series are labelled by peer id (online peers only,
so a departed peer's series stops instead of lingering); per-key reward series by key fingerprint.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

Labels = dict[str, str]


def escape_label(value: str) -> str:
    """A label value as the format wants it: backslash, double quote and newline escaped."""
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def format_value(value: float) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


class Exposition:
    """Builds the text one metric family at a time (HELP and TYPE once, then its samples)."""

    def __init__(self) -> None:
        self._lines: list[str] = []
        self._names: set[str] = set()

    def family(self, name: str, kind: str, help_text: str, samples: Iterable[tuple[Labels, Any]]) -> None:
        """Add ``name`` with ``samples`` (label dict, value); samples whose value is None are left out."""
        assert name.startswith("manta_") and name not in self._names, name
        assert kind in ("gauge", "counter"), kind
        kept = [(labels, value) for labels, value in samples if value is not None]
        if not kept:
            return
        self._names.add(name)
        self._lines.append(f"# HELP {name} {help_text}")
        self._lines.append(f"# TYPE {name} {kind}")
        for labels, value in kept:
            text = ",".join(f'{k}="{escape_label(v)}"' for k, v in labels.items())
            self._lines.append(
                f"{name}{{{text}}} {format_value(value)}" if text else f"{name} {format_value(value)}"
            )

    def one(self, name: str, kind: str, help_text: str, value: Any, labels: Labels | None = None) -> None:
        self.family(name, kind, help_text, [(labels or {}, value)])

    def text(self) -> str:
        return "\n".join(self._lines) + "\n"


def render_metrics(status: dict[str, Any], peers: list[dict[str, Any]], ledger: dict[str, Any]) -> str:
    """The ``/metrics`` page from ``/api/status``, ``/api/peers`` and ``/api/ledger`` data."""
    out = Exposition()
    task = status.get("task") or {}
    if task:
        out.one(
            "manta_task_info",
            "gauge",
            "The task this aggregator serves (labels); always 1.",
            1,
            {"task_id": task["task_id"], "task": task["task"], "mode": task["mode"]},
        )
        out.one("manta_task_total_rounds", "gauge", "Rounds in the task's schedule.", task["total_rounds"])
    current = status["round"]
    out.one("manta_round_current", "gauge", "The round the swarm is computing.", current["current"])
    out.one(
        "manta_round_samples", "gauge", "Samples reported so far in the current round.", current["samples"]
    )
    out.one("manta_round_target_samples", "gauge", "Samples that close a round.", current["target"])
    out.one("manta_peers_online", "gauge", "Peers announcing themselves in the DHT.", status["peers_online"])
    out.one("manta_cohorts", "gauge", "Cohorts with at least one online peer.", len(status["cohorts"]))
    out.one(
        "manta_swarm_throughput_samples_per_second",
        "gauge",
        "Sum of the online peers' training throughput.",
        status["throughput"],
    )
    online = [p for p in peers if p["online"]]
    out.family(
        "manta_peer_throughput_samples_per_second",
        "gauge",
        "An online peer's training throughput.",
        [({"peer_id": p["peer_id"], "cohort": p["cohort"] or ""}, p["throughput"]) for p in online],
    )
    out.family(
        "manta_peer_round",
        "gauge",
        "The round an online peer last reported progress in.",
        [({"peer_id": p["peer_id"]}, p["round"]) for p in online],
    )
    out.family(
        "manta_peer_last_seen_timestamp_seconds",
        "gauge",
        "When a newer record from an online peer was last seen (aggregator clock).",
        [({"peer_id": p["peer_id"]}, p["last_seen"]) for p in online],
    )
    last = status.get("last_round") or {}
    out.one("manta_last_round", "gauge", "The newest finished round with reports.", last.get("round"))
    out.one(
        "manta_last_round_loss",
        "gauge",
        "Sample-weighted mean training loss of that round.",
        last.get("loss"),
    )
    out.one(
        "manta_last_round_samples", "gauge", "Samples the swarm processed in that round.", last.get("samples")
    )
    traffic = status.get("traffic") or {}
    out.one(
        "manta_outer_steps", "gauge", "Outer steps the swarm took (sync = outer).", traffic.get("outer_steps")
    )
    out.one(
        "manta_cross_cohort_bytes_total",
        "counter",
        "Tensor payload bytes the peers' all-reduces sent and received across cohorts (wide-area).",
        traffic.get("cross_cohort_bytes"),
    )
    totals = status["totals"]
    out.one(
        "manta_rounds_observed",
        "gauge",
        "Rounds with progress reports seen by the monitor.",
        totals["rounds"],
    )
    out.one(
        "manta_samples_total", "counter", "Training samples reported over all rounds seen.", totals["samples"]
    )
    validation = status.get("validation")
    if validation:
        out.one(
            "manta_validation_round", "gauge", "The checkpoint round last evaluated.", validation["round"]
        )
        out.family(
            "manta_validation_metric",
            "gauge",
            "Validation metric of a sub-network of the newest evaluated checkpoint.",
            [
                ({"subnet": name, "metric": validation["metric"]}, validation.get(name))
                for name in ("largest", "smallest")
            ],
        )
    checkpoint = status.get("checkpoint") or {}
    out.one(
        "manta_checkpoint_round",
        "gauge",
        "The round of the newest checkpoint on disk.",
        checkpoint.get("round"),
    )
    _ledger_metrics(out, ledger)
    monitor = status["monitor"]
    out.one(
        "manta_monitor_readings_total", "counter", "DHT readings taken by the monitor.", monitor["readings"]
    )
    out.one(
        "manta_monitor_rejected_records_total",
        "counter",
        "DHT entries that failed signature or schema checks when read.",
        monitor["rejected"],
    )
    out.one(
        "manta_monitor_last_reading_timestamp_seconds",
        "gauge",
        "When the monitor last read the DHT.",
        monitor["last_reading"],
    )
    out.one(
        "manta_monitor_evaluations_total",
        "counter",
        "Checkpoints evaluated by the monitor.",
        monitor["evaluations"],
    )
    return out.text()


def _ledger_metrics(out: Exposition, ledger: dict[str, Any]) -> None:
    out.one(
        "manta_ledger_present",
        "gauge",
        "1 if the contribution ledger file exists and opens.",
        ledger["present"],
    )
    head = ledger.get("head")
    if not head:
        return
    out.one("manta_ledger_entries", "gauge", "Entries in the contribution ledger.", head["size"])
    checkpoint = head.get("checkpoint") or {}
    out.one(
        "manta_ledger_checkpoint_size",
        "gauge",
        "Entries under the latest signed checkpoint.",
        checkpoint.get("size"),
    )
    out.one(
        "manta_ledger_checkpoint_timestamp_seconds",
        "gauge",
        "When the latest ledger checkpoint was signed.",
        checkpoint.get("created"),
    )
    rewards = ledger.get("rewards")
    if rewards:
        out.one("manta_ledger_receipts", "gauge", "Receipts in the ledger.", rewards["receipts"])
        out.one(
            "manta_ledger_revocations", "gauge", "Receipts revoked in the ledger.", rewards["revocations"]
        )
        out.one(
            "manta_ledger_credits_flops",
            "gauge",
            "Credited training FLOPs over all keys.",
            rewards["total_credits"],
        )
        out.family(
            "manta_ledger_key_credits_flops",
            "gauge",
            "Credited training FLOPs of a volunteer key.",
            [({"key": p["fingerprint"]}, p["credits"]) for p in rewards["peers"]],
        )
