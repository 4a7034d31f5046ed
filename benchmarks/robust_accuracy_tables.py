"""The paired accuracy benchmark's tables (markdown): per row the mean accuracy over seeds and its
paired difference against ``clean`` on the same seed, with 95 % verdicts against the 1 pp bound; the
attacker's influence per applied round; every run's accuracy per seed.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from benchmarks.robust_accuracy_runs import KINDS, Row, RunResult


def paired(values: dict[int, float], clean: dict[int, float]) -> tuple[float, float, int]:
    """Mean and standard error over seeds of ``values - clean`` (same seed), and how many seeds."""
    diffs = [values[s] - clean[s] for s in values if s in clean]
    if not diffs:
        return math.nan, math.nan, 0
    se = statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else math.nan
    return statistics.fmean(diffs), se, len(diffs)


def verdict(mean: float, se: float, n: int, bound: float = 1.0) -> str:
    """Whether the 95 % t-interval of a paired difference lies within ``±bound`` pp ("yes"), wholly
    outside it ("no"), or straddles it ("open")."""
    if n < 2 or not math.isfinite(se):
        return "-"
    from scipy.stats import t  # scipy comes with hivemind

    half = float(t.ppf(0.975, n - 1)) * se
    if abs(mean) + half < bound:
        return "yes"
    if abs(mean) - half > bound:
        return "no"
    return "open"


def cost_verdict(mean: float, se: float, n: int, bound: float = 1.0) -> str:
    """Whether a change costs less than ``bound`` pp: "yes" if the one-sided 95 % upper bound of the
    drop (clean minus the row, ``-mean``) lies below ``bound``, "no" if its one-sided 95 % lower bound
    lies above it, "open" otherwise. Why one-sided: an attack is judged by whether it costs
    accuracy, and a row that reads above clean costs nothing, however far above."""
    if n < 2 or not math.isfinite(se):
        return "-"
    from scipy.stats import t

    margin = float(t.ppf(0.95, n - 1)) * se
    if -mean + margin < bound:
        return "yes"
    if -mean - margin > bound:
        return "no"
    return "open"


def _pp(mean: float, se: float) -> str:
    if not math.isfinite(mean):
        return "-"
    return f"{mean:+.2f} ± {se:.2f}" if math.isfinite(se) else f"{mean:+.2f}"


def table(rows: Sequence[Row], results: Sequence[RunResult]) -> str:
    """The markdown table: per row the mean accuracy over seeds, the paired difference against clean
    (mean ± standard error, and whether its 95 % interval lies within 1 pp), how the attacker was
    kept out, and what the rounds cost."""
    by_row: dict[str, list[RunResult]] = {}
    for r in results:
        by_row.setdefault(r.row, []).append(r)
    clean = {k: {r.seed: r.accuracy[k] for r in by_row.get("clean", [])} for k in KINDS}
    lines = [
        "| row | largest % | smallest % | largest Δ pp | smallest Δ pp | within ±1 pp (95 %) | costs < 1 pp (95 %, one-sided) "
        "| attacker's non-zero values kept out: excluded / named / dropped | first excluded or named / receipt refused (round) "
        "| honest peers: named / receipts refused / replies refused / parts dropped | rounds skipped | s per run |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        runs = by_row.get(row.name, [])
        if not runs:
            continue
        acc = {k: {r.seed: r.accuracy[k] for r in runs} for k in KINDS}
        means = {k: statistics.fmean(acc[k].values()) for k in KINDS}
        if row.name == "clean":
            deltas = ["(reference)", "(reference)", "", ""]
        else:
            stats = {k: paired(acc[k], clean[k]) for k in KINDS}
            deltas = [_pp(*stats[k][:2]) for k in KINDS]
            deltas.append(" / ".join(verdict(*stats[k]) for k in KINDS))
            deltas.append(" / ".join(cost_verdict(*stats[k]) for k in KINDS))
        if row.attack and row.robust:
            sent = max(1, sum(r.attacker_values for r in runs))
            kept = (
                f"{100 * sum(r.attacker_excluded for r in runs) / sent:.1f} % / "
                f"{100 * sum(r.attacker_named for r in runs) / sent:.1f} % / "
                f"{100 * sum(r.attacker_dropped for r in runs) / sent:.1f} %"
            )
            first = ", ".join(f"{_round(r.first_kept_out)} / {_round(r.first_refused_receipt)}" for r in runs)
        else:
            kept = first = ""
        honest = (
            f"{sum(r.honest_named for r in runs)} / {sum(r.honest_refused_receipts for r in runs)} / "
            f"{sum(r.honest_replies_refused for r in runs)} / {sum(r.honest_dropped for r in runs)}"
            if row.robust
            else ""
        )
        skipped = sum(len(r.skipped) for r in runs)
        diverged = [r for r in runs if r.diverged_at is not None]
        skip_text = f"{skipped}" + (
            f"; diverged in {len(diverged)} of {len(runs)} (round {', '.join(str(r.diverged_at) for r in diverged)})"
            if diverged
            else ""
        )
        wall = statistics.fmean(r.wall for r in runs)
        lines.append(
            f"| {row.name} | {means['largest']:.2f} | {means['smallest']:.2f} | {' | '.join(deltas)} "
            f"| {kept} | {first} | {honest} | {skip_text} | {wall:.0f} |"
        )
    return "\n".join(lines)


def influence_table(rows: Sequence[Row], results: Sequence[RunResult]) -> str:
    """Per attacked row, over every applied round of every seed: how far the applied update lay from
    what that round's honest gradients call for (:class:`~benchmarks.simulated_swarm.Influence`).
    Unlike the final accuracy, this compares two updates of one state, so no drift blurs it."""
    lines = [
        "| row | rounds | attacker's pull, in honest peers: median / 90th pct / max "
        "| deviation from the clean update: median / max | one honest peer's: median |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        measured = [i for r in results if r.row == row.name for i in r.influence]
        if not row.attack or not measured:
            continue
        pulls = sorted(i.pull for i in measured)
        deviations = sorted(i.deviation for i in measured)
        lines.append(
            f"| {row.name} | {len(measured)} | {_ratio(statistics.median(pulls))} / "
            f"{_ratio(pulls[int(0.9 * (len(pulls) - 1))])} / {_ratio(pulls[-1])} | "
            f"{100 * statistics.median(deviations):.1f} % / {100 * deviations[-1]:.1f} % | "
            f"{100 * statistics.median(i.one_peer for i in measured):.1f} % |"
        )
    return "\n".join(lines)


def _ratio(value: float) -> str:
    return f"{value:.3g}"


def per_seed(rows: Sequence[Row], results: Sequence[RunResult]) -> str:
    """Every run's accuracy, largest / smallest, by row and seed."""
    seeds = sorted({r.seed for r in results})
    found = {(r.row, r.seed): r for r in results}
    lines = ["| row | " + " | ".join(f"seed {s}" for s in seeds) + " |", "|---" * (len(seeds) + 1) + "|"]
    for row in rows:
        cells = [
            f"{found[row.name, s].accuracy['largest']:.1f} / {found[row.name, s].accuracy['smallest']:.1f}"
            if (row.name, s) in found
            else ""
            for s in seeds
        ]
        if any(cells):
            lines.append(f"| {row.name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _round(value: int | None) -> str:
    return "-" if value is None else str(value)


def print_tables(rows: Sequence[Row], results: Sequence[RunResult]) -> None:
    print(table(rows, results))
    print("\nThe update each attacked round applied, against that round's honest gradients:\n")
    print(influence_table(rows, results))
    print("\nPer seed, largest / smallest %:\n")
    print(per_seed(rows, results))
