"""Accuracy under attack, paired: does one poisoned peer of six cost the model more than 1 pp?

Measured on the final accuracy of the largest and smallest sub-networks, against a clean run. Why
in-process: a real swarm's sample and group order depend on timing; here only the aggregation varies.

Six simulated peers (:mod:`benchmarks.simulated_swarm`) train one shared model in one process, round
after round, with the swarm's own pieces:

- the task is the red team's (digits, width 0.25, 2 sub-networks a round, 384 samples a round,
  ``SwarmOptions`` turned into a ``TaskSpec`` by the aggregator's ``build_task_spec`` and into a
  ``Workload`` by ``swarm_train_options``, as peers do); ``--rounds`` is also the schedule's length;
- each peer's gradient is ``supernet.contribution.compute_contribution`` over its own sample stream
  (64 samples: two mini-batches of 32), all peers from the same state (data-parallel: the same
  sub-networks), turned into its per-sample mean as ``peer.averaging.buffers.to_own_mean`` does;
- the attacker (peer 5) sends what ``tests/adversaries/dishonest_peer.poisoned`` makes of it;
- the all-reduce is hivemind's partition (``load_balance_peers`` with equal bandwidths,
  ``TensorPartContainer`` with 512 KiB parts; the group's order shuffled every round from a seeded
  generator) and, per reducer, MANTA's ``RobustPartReducer`` with the reducer's own
  ``AlignmentRecord`` kept across rounds, as ``ExactAllReduceRunner`` builds it (suspects left out,
  cosines noted after the all-reduce); row ``plain`` uses hivemind's own ``TensorPartReducer``
  (``robust_averaging = false``, 4 MiB parts);
- a non-finite average is not applied (``VerifiedAverager``); a finite one is applied with the task's
  optimizer as a worker applies it (``optimizer_step``);
- the final state is evaluated as the testbed's summary does (largest and smallest sub-network,
  BN recalibrated, validation split).

A (row, seed) pair gives the same bits every time (torch on one thread, every draw from an explicit
generator), so the difference between a row and ``clean`` on the same seed is the effect of that row's
change plus the divergence of two trajectories that part at the first differing bit (row ``plain``,
honest but summed in another order, shows its size). Several seeds give the mean paired difference
and its standard error.

Not exercised: networking, timing, matchmaking, partial groups and retries, the reply checks' effect
on who commits (only counted here), the aggregator and credit (the red team covers those). Every
peer contributes exactly 64 samples, a round whose average is refused is skipped, and a run whose
parameters stop being finite ends there.

    python -m benchmarks.robust_accuracy [--rounds 40] [--seeds 3] [--attacks sign,x1000,nan,garbage]
                                         [--plain-attack-seeds 1] [--no-clean-5] [--json OUT]
                                         [--first-seed 0] [--only clean,sign,...]
    python -m benchmarks.robust_accuracy --tables-from A.json B.json ...   (the table of several processes)

Runs are independent: a table's seeds can be split over processes (each with its own
``--first-seed``, ``--seeds`` and ``--json``) and printed together with ``--tables-from``. The plain
mean under an attack is a contrast, not a candidate: by default it runs for the first seed only
(``--plain-attack-seeds``). The table is what benchmarks/RESULTS.md records.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import torch

from benchmarks.robust_accuracy_runs import RunResult, rows_for, run
from benchmarks.robust_accuracy_tables import print_tables
from benchmarks.simulated_swarm import Influence
from tests.adversaries.dishonest_peer import POISONS


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


def load_runs(paths: Sequence[Path]) -> list[RunResult]:
    """The runs of several ``--json`` files (one per process), each (row, seed) once; exits with a
    one-line message on a file that is missing or not such a document, or two runs that disagree."""
    found: dict[tuple[str, int], RunResult] = {}
    for path in paths:
        try:
            document = json.loads(path.read_text())
            runs = [
                RunResult(**{**item, "influence": [Influence(**i) for i in item.get("influence", [])]})
                for item in document["runs"]
            ]
        except (OSError, ValueError, KeyError, TypeError) as e:
            sys.exit(f"robust_accuracy: {path}: not a --json document of this benchmark ({e})")
        for measured in runs:
            known = found.setdefault((measured.row, measured.seed), measured)
            if known.digest != measured.digest:
                sys.exit(
                    f"robust_accuracy: {measured.row} seed {measured.seed} ended in two different states in {path}"
                )
    return list(found.values())


def _write(path: Path, command: str, before, after, results: Sequence[RunResult]) -> None:
    """Write ``results`` to ``path`` as the --json document :func:`load_runs` reads."""
    document = dict(command=command, load_before=before, load_after=after, runs=[asdict(r) for r in results])
    path.write_text(json.dumps(document, indent=2) + "\n")


if __name__ == "__main__":
    main()
