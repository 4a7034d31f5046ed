"""The same local swarm at two commits, side by side: where did a change move the round's time?

Checks each commit out into a temporary git worktree and runs ``manta-swarm`` from it (the same
virtual environment; the worktree's packages come first on ``PYTHONPATH``, for the peers too),
alternating between the two commits ``--runs`` times so that a drift in the machine's speed falls on
both alike. Prints, per commit, the mean round time and its stages (from every peer's
``rounds.jsonl``, committed rounds after the first two), the wall time of the run and the final
accuracy, then the ratio of the second commit to the first.

    python -m benchmarks.commit_ab --commits 789701b,HEAD [--runs 2] [--out DIR] \\
        -- --peers 2 --rounds 24 --target-samples 64 --subnets 2 --width-mult 0.25
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STAGES = ("compute", "cohort", "cross", "broadcast", "commit", "check")  # check: within cohort or cross
WARM_UP_ROUNDS = 2  # the first rounds include start-up and the deadlines' learning


@dataclass
class CommitRuns:
    """What one commit's runs measured."""

    commit: str
    walls: list[float] = field(default_factory=list)
    rounds: list[dict] = field(default_factory=list)  # every peer's committed rounds, all runs
    accuracy: list[dict] = field(default_factory=list)

    def round_seconds(self) -> float:
        return statistics.mean(r["seconds"] for r in self.rounds) if self.rounds else float("nan")

    def stage_seconds(self, stage: str) -> float:
        return (
            statistics.mean(r["stages"].get(stage, 0.0) for r in self.rounds) if self.rounds else float("nan")
        )


def run_once(worktree: Path, out: Path, swarm_args: list[str]) -> tuple[float, list[dict], dict]:
    out.mkdir(parents=True)
    env = dict(os.environ, PYTHONPATH=str(worktree))
    cmd = [sys.executable, "-c", "import sys; from testbed.cli import main; sys.exit(main())", *swarm_args]
    cmd += ["--data-dir", str(out / "run"), "--summary", str(out / "summary.json")]
    started = time.monotonic()
    done = subprocess.run(cmd, cwd=out, env=env, capture_output=True, text=True, timeout=3600)
    wall = time.monotonic() - started
    (out / "stdout.txt").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise SystemExit(f"manta-swarm failed in {out} (exit {done.returncode}); see stdout.txt")
    rounds = []
    for path in sorted((out / "run").glob("peer-*/rounds.jsonl")):
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        rounds += [r for r in rows[WARM_UP_ROUNDS:] if r.get("committed")]
    summary = json.loads((out / "summary.json").read_text())
    return wall, rounds, summary.get("accuracy", {})


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--commits", required=True, help="two commits, comma-separated (any git revision)")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("swarm_args", nargs=argparse.REMAINDER, help="after --: manta-swarm's options")
    args = parser.parse_args()
    commits = [c for c in args.commits.split(",") if c]
    if len(commits) != 2:
        sys.exit("--commits takes exactly two revisions, e.g. 789701b,HEAD")
    if args.runs < 1:
        sys.exit("--runs must be at least 1")
    swarm_args = [a for a in args.swarm_args if a != "--"]
    resolved = []
    for c in commits:
        got = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", c], capture_output=True, text=True
        )
        if got.returncode != 0:
            sys.exit(f"not a revision of this repository: {c}")
        resolved.append(got.stdout.strip())
    out = args.out or Path(tempfile.mkdtemp(prefix="manta-commit-ab-"))
    print(
        f"$ python -m benchmarks.commit_ab --commits {args.commits} --runs {args.runs} -- {' '.join(swarm_args)}"
    )
    print(f"load average before: {os.getloadavg()}; {os.cpu_count()} cores; results under {out}")
    results = [CommitRuns(c) for c in resolved]
    with tempfile.TemporaryDirectory(prefix="manta-worktrees-") as trees:
        worktrees = [Path(trees) / c for c in resolved]
        try:
            for commit, tree in zip(resolved, worktrees):
                subprocess.run(
                    ["git", "-C", str(REPO), "worktree", "add", "--detach", "-q", str(tree), commit],
                    check=True,
                )
            for i in range(args.runs):
                for result, tree in zip(results, worktrees):
                    print(f"run {i + 1}/{args.runs} at {result.commit} ...", flush=True)
                    wall, rounds, accuracy = run_once(tree, out / f"{result.commit}-{i}", swarm_args)
                    result.walls.append(wall)
                    result.rounds += rounds
                    result.accuracy.append(accuracy)
                    print(f"  {wall:.1f} s, {len(rounds)} peer-rounds, accuracy {accuracy}", flush=True)
        finally:
            for tree in worktrees:
                subprocess.run(
                    ["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)], check=False
                )
    print(f"load average after: {os.getloadavg()}")
    first, second = results
    rows = [("round s", first.round_seconds(), second.round_seconds())]
    rows += [(f"  {s}", first.stage_seconds(s), second.stage_seconds(s)) for s in STAGES]
    rows.append(("run wall s", statistics.mean(first.walls), statistics.mean(second.walls)))
    print(f"\n{'':12} {first.commit:>10} {second.commit:>10} {'ratio':>7}")
    for name, a, b in rows:
        ratio = f"{b / a:7.2f}" if a > 0 else "      -"
        print(f"{name:12} {a:10.3f} {b:10.3f} {ratio}")


if __name__ == "__main__":
    main()
