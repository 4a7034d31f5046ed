"""Accuracy under attack, paired: does one poisoned peer of six cost the model more than 1 pp?

Issue 19 asks that, with one dishonest peer of six sending a poisoned gradient (sign-flipped, x1000,
NaN, random garbage), the final accuracy of the largest and smallest sub-networks stay within 1
percentage point of a clean run. The swarm red team (``benchmarks/red_team.py``) cannot measure that
on this machine: a real swarm's sample order and group order depend on timing, and two runs of the
same row scatter by 3-10 pp. Any gap below that is invisible there.

This benchmark takes the timing out and keeps the aggregation. Six simulated peers train one shared
model in one process, round after round, with the swarm's own pieces:

- the task is the red team's (digits, width 0.25, 2 sub-networks a round, 384 samples a round,
  ``SwarmOptions`` turned into a ``TaskSpec`` by the aggregator's ``build_task_spec`` and into a
  ``Workload`` by ``swarm_train_options``, as peers do); ``--rounds`` is also the schedule's length;
- each peer's gradient is ``supernet.contribution.compute_contribution`` over its own sample stream
  (64 samples: two mini-batches of 32), all peers from the same state (data-parallel: the same
  sub-networks), turned into its per-sample mean as ``peer.averaging.hierarchy`` does;
- the attacker (peer 5) sends what ``tests/adversaries/dishonest_peer.poisoned`` makes of it;
- the all-reduce is hivemind's partition (``load_balance_peers`` with equal bandwidths,
  ``TensorPartContainer`` with 512 KiB parts; the group's order shuffled every round, as a hivemind
  leader does, but from a seeded generator) and, per reducer, MANTA's ``RobustPartReducer`` with the
  reducer's own ``AlignmentRecord`` kept across rounds, exactly as ``ExactAllReduceRunner`` builds it
  (suspects left out, cosines noted after the all-reduce); row ``plain`` uses hivemind's own
  ``TensorPartReducer`` (``robust_averaging = false``, 4 MiB parts);
- a non-finite average is not applied (``VerifiedAverager``); a finite one is applied with the task's
  optimizer as a worker applies it (``optimizer_step``);
- the final state is evaluated as the testbed's summary does (largest and smallest sub-network,
  BN recalibrated, validation split).

Every random draw comes from the explicit generators the code already uses (sample streams,
augmentation, initial weights, BN calibration), the group order from a seeded generator, and torch
runs on one thread: a (row, seed) pair gives the same bits every time. Rows differ only in the
aggregation and in what peer 5 sends, so the difference between a row and ``clean`` on the same seed
is the effect of that change (plus the chaos of two trajectories that part at the first differing
bit: row ``plain``, honest but summed in another order, shows how large that is). Several seeds give
the mean paired difference and its standard error.

What it does not exercise: networking, timing, matchmaking, partial groups and retries, the reply
checks' effect on who commits (only counted here), the aggregator and credit. The red team covers
those. Every peer contributes exactly 64 samples (the swarm's counts vary with speed), and a round
whose average is refused is skipped (the swarm would retry it with new groups). A run whose
parameters stop being finite ends there: every later gradient would be NaN, and no later average
would be applied.

    python -m benchmarks.robust_accuracy [--rounds 40] [--seeds 3] [--attacks sign,x1000,nan,garbage]
                                         [--plain-attack-seeds 1] [--no-clean-5] [--json OUT]
                                         [--first-seed 0] [--only clean,sign,...]
    python -m benchmarks.robust_accuracy --tables-from A.json B.json ...   (the table of several processes)

Runs are independent, so a table's seeds can be split over processes (one per core, each with its
own ``--first-seed``, ``--seeds`` and ``--json``) and printed together with ``--tables-from``.

The plain mean under an attack is a contrast, not a candidate: by default it runs for the first seed
only (``--plain-attack-seeds``). One run (a row and a seed) takes 3-5 s a round on one core of this
2-core VM, plus a few seconds to evaluate: a 40-round run 2-4 minutes when nothing else runs. The
table is what benchmarks/RESULTS.md records.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

# simulated_swarm prepares the process for hivemind (hivemind_adapter.runtime) before it is imported
from benchmarks.simulated_swarm import (
    ATTACKER,
    PEERS,
    PER_PEER,
    AllReduce,
    Influence,
    all_reduce,
    group_order,
    influence,
    peer_mean,
    swarm_workload,
)
from robust_aggregation.alignment import AlignmentRecord
from supernet.state import digest, init_optimizer_state, state_tensors
from supernet.training.optimizer import optimizer_step
from supernet.training.schedule import maybe_sort_channels, step_configs
from tests.adversaries.dishonest_peer import POISONS

KINDS = ("largest", "smallest")


@dataclass(frozen=True)
class Row:
    """One way of aggregating: robust (CenteredClip) or plain, an attack by peer 5 or none, and how
    many peers take part (``clean-5``: the five honest ones alone)."""

    name: str
    robust: bool
    attack: str | None = None
    peers: int = PEERS


def rows_for(attacks: Sequence[str], clean_5: bool) -> list[Row]:
    rows = [Row("clean", True), Row("plain", False)]
    if clean_5:
        rows.append(Row("clean-5", True, peers=PEERS - 1))
    rows += [Row(a, True, a) for a in attacks]
    return rows + [Row(f"plain+{a}", False, a) for a in attacks]


@dataclass
class RunResult:
    """What one (row, seed) run measured."""

    row: str
    seed: int
    accuracy: dict[str, float]  # largest / smallest, in %
    wall: float
    digest: str  # of the final parameters and optimizer state: the determinism check compares these
    skipped: list[int] = field(default_factory=list)  # rounds whose average was refused (not finite)
    diverged_at: int | None = None  # the round after whose step the parameters were no longer finite
    # Values the attacker sent in parts that were not all zeros (a zero part, which the supernet's
    # unused weights give, is the same flipped or scaled: no attack there), the roll left out ...
    attacker_values: int = 0
    attacker_excluded: int = 0  # ... of which a reducer's AlignmentRecord had it left out
    attacker_named: int = 0  # ... of which a reducer refused or named it (ClipResult.outliers)
    attacker_dropped: int = 0  # ... of which a reducer dropped it without naming it (ClipResult.dropped)
    first_kept_out: int | None = None  # the first round any reducer excluded or named it
    first_refused_receipt: int | None = None  # the first round two reducers named it (its receipt refused)
    honest_named: int = 0  # (round, reducer, honest sender) namings, outliers or excluded
    honest_refused_receipts: int = 0  # (round, honest sender) pairs named by two reducers or more
    honest_replies_refused: int = 0  # replies an honest member's reply check would have refused
    honest_dropped: int = 0  # (round, reducer, honest sender, part) drops without naming
    honest_result_ratio: float = 0.0  # the largest result ratio (proof point 6) an honest member saw
    influence: list[Influence] = field(default_factory=list)  # per applied round, with an attacker


def run(row: Row, seed: int, rounds: int) -> RunResult:
    """Train ``rounds`` rounds with ``row``'s aggregation from ``seed``'s task; evaluate the result."""
    started = time.monotonic()
    workload, task_seed = swarm_workload(seed, rounds)
    cfg = workload.cfg
    net = workload.build()
    optimizer = workload.make_optimizer(net)
    init_optimizer_state(net, optimizer)
    params = list(net.parameters())
    peers = list(range(row.peers))
    records = {p: AlignmentRecord() for p in peers} if row.robust else None
    result = RunResult(row.name, seed, {}, 0.0, "")
    for round_index in range(rounds):
        maybe_sort_channels(net, round_index, cfg, optimizer)  # peer/worker.py, before its compute
        configs = step_configs(net, round_index, cfg)  # data-parallel: every peer the same sub-networks
        order = group_order(row.peers, seed, round_index)
        attacker = order.index(ATTACKER) if row.attack else None
        honest: list[list[torch.Tensor]] = [[] for _ in order]
        means: list[list[torch.Tensor]] = [[] for _ in order]
        # the attacker's first: computing a gradient moves batch norm's running statistics in the
        # shared model, so the order is part of what makes a run repeat bit for bit
        first = [] if attacker is None else [attacker]
        for position in first + [i for i in range(len(order)) if i != attacker]:
            peer = order[position]
            honest[position], means[position] = peer_mean(
                workload, net, configs, task_seed, round_index, peer, row.attack if peer == ATTACKER else None
            )
        if (
            attacker is not None
            and not row.robust
            and not all(bool(torch.isfinite(t).all()) for t in means[attacker])
        ):
            result.skipped.append(round_index)  # a plain mean with a NaN in it: nothing is applied
            continue
        names = [f"peer-{p}" for p in order]
        reduced = all_reduce(
            means, [float(PER_PEER)] * len(order), row.robust,
            [records[p] for p in order] if records is not None else None, names,
        )  # fmt: skip
        _count(result, reduced, round_index, attacker)
        if reduced.average is None:
            result.skipped.append(round_index)
            continue
        if attacker is not None:
            result.influence.append(influence(round_index, reduced.average, honest, attacker))
        for p, g in zip(params, reduced.average):  # peer/worker.py, Apply
            p.grad = g.clone()
        optimizer_step(net, optimizer, round_index, cfg)
        if not all(bool(torch.isfinite(p).all()) for p in params):
            # Every later gradient is computed through these weights (every sub-network of the
            # sandwich shares them), so none would be finite and no later step would be applied.
            result.diverged_at = round_index
            break
    result.digest = digest(state_tensors(net, optimizer))
    rows = workload.evaluate(net, {"largest": net.largest_config(), "smallest": net.smallest_config()})
    result.accuracy = {r["name"]: 100.0 * float(r[workload.metric_name]) for r in rows}
    result.wall = time.monotonic() - started
    return result


def _count(result: RunResult, reduced: AllReduce, round_index: int, attacker: int | None) -> None:
    """Add one round's namings (robust rows) to ``result``."""
    n = len(reduced.excluded)
    for s in range(n):
        reducers = sum(s in reduced.named(r) for r in range(n))
        if s == attacker:
            if reducers and result.first_kept_out is None:
                result.first_kept_out = round_index
            if reducers >= 2 and result.first_refused_receipt is None:
                result.first_refused_receipt = round_index
            continue
        result.honest_named += reducers
        result.honest_dropped += sum(len(reduced.dropped[r].get(s, ())) for r in range(n))
        result.honest_refused_receipts += reducers >= 2
        result.honest_replies_refused += reduced.replies_refused[s]
        result.honest_result_ratio = max(result.honest_result_ratio, reduced.result_ratios[s])
    if attacker is None:
        return
    for r in range(n):
        sizes, live = reduced.sizes[r], reduced.live[r][attacker]
        sent = sum(sizes[j] for j in live)
        result.attacker_values += sent
        if attacker in reduced.excluded[r]:
            result.attacker_excluded += sent
        else:
            named, dropped = reduced.outliers[r].get(attacker, ()), reduced.dropped[r].get(attacker, ())
            result.attacker_named += sum(sizes[j] for j in named if j in live)
            result.attacker_dropped += sum(sizes[j] for j in dropped if j in live)


# ------------------------------------------------------------------------------------------ the table


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
    lies above it, "open" otherwise. The question the issue asks of an attack is whether it costs
    accuracy; a row that reads above clean costs nothing, however far above."""
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--seeds", type=int, default=3, help="how many seeds (the task's seed)")
    parser.add_argument(
        "--first-seed",
        type=int,
        default=0,
        help="run seeds FIRST .. FIRST+SEEDS-1 (to split seeds over processes)",
    )
    parser.add_argument(
        "--attacks", default=",".join(POISONS), help="a comma-separated list of " + ", ".join(POISONS)
    )
    parser.add_argument(
        "--plain-attack-seeds",
        type=int,
        default=1,
        help="run the plain mean under each attack for the first N seeds only (0: never; a contrast)",
    )
    parser.add_argument("--no-clean-5", action="store_true", help="skip the five honest peers alone")
    parser.add_argument("--only", default="", help="run only these rows (comma-separated names)")
    parser.add_argument("--json", type=Path, help="write every run's measurements here (after each run)")
    parser.add_argument(
        "--tables-from",
        type=Path,
        nargs="+",
        metavar="JSON",
        help="train nothing: print the tables of the runs these --json files hold (seeds split over processes)",
    )
    args = parser.parse_args()
    attacks = tuple(a for a in args.attacks.split(",") if a)
    unknown = [a for a in attacks if a not in POISONS]
    if unknown or args.rounds < 1 or args.seeds < 1 or args.first_seed < 0:
        sys.exit(
            f"robust_accuracy: unknown attack(s) {', '.join(unknown)}"
            if unknown
            else "robust_accuracy: need --rounds, --seeds >= 1 and --first-seed >= 0"
        )
    rows = rows_for(attacks, not args.no_clean_5)
    if args.tables_from:
        print_tables(rows, load_runs(args.tables_from))
        return
    if args.only:
        wanted = set(args.only.split(","))
        rows = [r for r in rows if r.name in wanted]
    torch.set_num_threads(1)  # the same bits whatever the machine's cores
    command = f"python -m benchmarks.robust_accuracy {' '.join(sys.argv[1:])}"
    load_before = os.getloadavg()
    print(f"$ {command}")
    print(f"load average before: {load_before}; {os.cpu_count()} cores; torch threads 1", flush=True)
    started = time.monotonic()
    results: list[RunResult] = []
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    for seed in seeds:  # seed by seed: a stopped run still leaves complete pairs
        for row in rows:
            if row.attack and not row.robust and seed >= args.plain_attack_seeds:
                continue
            result = run(row, seed, args.rounds)
            results.append(result)
            notes = f"; {len(result.skipped)} rounds skipped" if result.skipped else ""
            if row.robust:
                notes += f"; honest result ratio at most {result.honest_result_ratio:.2f}"
            if result.diverged_at is not None:
                notes += f"; diverged at round {result.diverged_at}"
            print(
                f"{row.name:<14} seed {seed}: largest {result.accuracy['largest']:6.2f} %  smallest "
                f"{result.accuracy['smallest']:6.2f} %  ({result.wall:.0f} s{notes}) {result.digest[:12]}",
                flush=True,
            )
            if args.json:
                _write(args.json, command, load_before, None, results)
    load_after = os.getloadavg()
    total = time.monotonic() - started
    print(f"\n$ {command}\nload average before: {load_before}   after: {load_after}; total {total:.0f} s\n")
    print_tables(rows, results)
    if args.json:
        _write(args.json, command, load_before, load_after, results)


def print_tables(rows: Sequence[Row], results: Sequence[RunResult]) -> None:
    print(table(rows, results))
    print("\nThe update each attacked round applied, against that round's honest gradients:\n")
    print(influence_table(rows, results))
    print("\nPer seed, largest / smallest %:\n")
    print(per_seed(rows, results))


def load_runs(paths: Sequence[Path]) -> list[RunResult]:
    """The runs of several ``--json`` files (one per process), each (row, seed) once; exits with a
    one-line message on a file that is missing or not such a document, or two runs that disagree."""
    found: dict[tuple[str, int], RunResult] = {}
    for path in paths:
        try:
            document = json.loads(path.read_text())
            runs = [
                RunResult(**{**run, "influence": [Influence(**i) for i in run.get("influence", [])]})
                for run in document["runs"]
            ]
        except (OSError, ValueError, KeyError, TypeError) as e:
            sys.exit(f"robust_accuracy: {path}: not a --json document of this benchmark ({e})")
        for run in runs:
            known = found.setdefault((run.row, run.seed), run)
            if known.digest != run.digest:
                sys.exit(
                    f"robust_accuracy: {run.row} seed {run.seed} ended in two different states in {path}"
                )
    return list(found.values())


def _write(path: Path, command: str, before, after, results: Sequence[RunResult]) -> None:
    document = dict(command=command, load_before=before, load_after=after, runs=[asdict(r) for r in results])
    path.write_text(json.dumps(document, indent=2) + "\n")


if __name__ == "__main__":
    main()
