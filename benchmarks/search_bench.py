"""Sub-network search on a ``digits``-trained supernet: evolution against random search, and the
latency model's error (issue 9).

1. A checkpoint: trained once with the classification-quality settings (``benchmarks/ofa_quality.py``:
   width 0.5, head 256, sandwich K = 4, SGD lr 0.1, 160 steps) and cached under ``--cache-dir``.
2. Latency: a lookup table built on the CPU with one torch thread, then checked against the
   end-to-end latency of ``--latency-configs`` random exported sub-networks (mean absolute error in %;
   target <= 15 %).
3. Search under a budget of half the largest sub-network's FLOPs: evolution and random search with the
   same number of evaluations (direct accuracy: BN recalibration, then the full validation set), for
   each seed in ``--seeds``; target: evolution's best >= random's best.
4. The accuracy predictor: trained on random searches' evaluated sub-networks (unbiased samples of
   the space under the budget) — the first seed's, and all seeds' together — RMSE on a held-out fifth,
   next to the RMSE of always predicting the mean, and the rank agreement (Kendall tau).

    .venv/bin/python -m benchmarks.search_bench                       # about 15 min with training
    .venv/bin/python -m benchmarks.search_bench --evaluations 60      # a quicker look
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from supernet.checkpoint import load_checkpoint, save_trained
from supernet.config import SubnetConfig, derive_seed
from supernet.search.accuracy import DirectEvaluator
from supernet.search.cost import FlopsCost
from supernet.search.evolution import EvolutionSettings, SearchResult, evolutionary_search, random_search
from supernet.search.latency import build_latency_table, mean_abs_pct_error, validate
from supernet.search.predictor import fit_with_holdout
from supernet.training.config import TrainConfig
from supernet.training.loop import train
from supernet.workload import workload_for


def load() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "n/a"


TRAIN_SETTINGS = dict(
    width_mult=0.5,
    head_channels=256,
    schedule="sandwich",
    num_subnets=4,
    batch_size=64,
    lr=0.1,
    warmup_steps=10,
    label_smoothing=0.1,
    bn_calibration_batches=16,
    eval_random_subnets=3,
    log_every=25,
)


def checkpoint(cache: Path, steps: int, seed: int, say) -> Path:
    """The cached digits checkpoint, trained (and cached) on first use."""
    path = cache / f"digits-w0.5-{steps}steps-seed{seed}.pt"
    if path.exists():
        say(f"checkpoint: {path} (cached)")
        return path
    cfg = TrainConfig(total_steps=steps, seed=seed, **TRAIN_SETTINGS)
    workload = workload_for("digits", {k: v for k, v in cfg.to_dict().items() if k != "task"})
    say(f"training the digits supernet for {steps} steps (cached afterwards at {path})")
    result = train(workload.cfg, workload.task, progress=say)
    save_trained(path, workload, result["net"], round_index=steps - 1, meta={"seconds": result["seconds"]})
    return path


class CountingCache:
    """Direct evaluations shared between the searches (a config's accuracy does not depend on who asks),
    counting how many were really computed."""

    def __init__(self, direct: DirectEvaluator) -> None:
        self.direct = direct
        self.values: dict[str, float] = {}

    def evaluate(self, configs: Sequence[SubnetConfig]) -> dict[str, float]:
        todo = [c for c in configs if c.hash not in self.values]
        self.values.update(self.direct.evaluate(todo))
        return {c.hash: self.values[c.hash] for c in configs}


def best_after(result: SearchResult, count: int) -> float:
    return max(c.metric for c in result.candidates[:count])


def tail_mean(result: SearchResult, share: float = 0.3) -> float:
    """Mean metric of the last ``share`` of a search's evaluations (where evolution has converged)."""
    tail = result.candidates[-max(1, round(share * result.evaluations)) :]
    return sum(c.metric for c in tail) / len(tail)


def kendall_tau(a: Sequence[float], b: Sequence[float]) -> float:
    """Rank agreement of two sequences (tau-a): +1 same order, 0 unrelated."""
    concordant = discordant = 0
    for i in range(len(a)):
        for j in range(i + 1, len(a)):
            s = (a[i] - a[j]) * (b[i] - b[j])
            concordant += s > 0
            discordant += s < 0
    pairs = len(a) * (len(a) - 1) / 2
    return (concordant - discordant) / pairs if pairs else 0.0


def predictor_report(space, candidates) -> dict:
    """Held-out RMSE (and Kendall tau) of the predictor trained on ``candidates``' configs and metrics."""
    configs, values = [c.config for c in candidates], [c.metric for c in candidates]
    predictor, report = fit_with_holdout(space, configs, values, seed=0)
    order = list(range(len(configs)))
    random.Random(derive_seed("predictor-split", 0)).shuffle(order)  # the split fit_with_holdout made
    held = order[: report["n_test"]]
    predicted = predictor.predict([configs[i] for i in held])
    return {**report, "kendall_tau": kendall_tau(predicted, [values[i] for i in held])}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cache-dir", type=Path, default=Path("benchmarks/.cache"))
    parser.add_argument("--steps", type=int, default=160, help="training steps of the cached checkpoint")
    parser.add_argument("--train-seed", type=int, default=0)
    parser.add_argument("--evaluations", type=int, default=200, help="evaluations per search")
    parser.add_argument("--population", type=int, default=20)
    parser.add_argument("--seeds", default="0", help="search seeds, comma-separated (e.g. 0,1,2)")
    parser.add_argument(
        "--budget-fraction", type=float, default=0.5, help="of the largest sub-network's FLOPs"
    )
    parser.add_argument("--latency-configs", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1: the CPU is shared)")
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    say(f"load average at start: {load()} ({os.cpu_count()} CPUs, torch threads {torch.get_num_threads()})")
    started = time.perf_counter()
    path = checkpoint(args.cache_dir, args.steps, args.train_seed, say)
    loaded = load_checkpoint(path)
    workload, net = loaded.workload, loaded.net
    space, input_size = net.space, workload.input_size
    device = torch.device("cpu")

    # ---- latency model ---------------------------------------------------------------------------
    t0 = time.perf_counter()
    table = build_latency_table(net, workload.family, input_size, device, threads=args.threads, progress=say)
    build_seconds = time.perf_counter() - t0
    rng = random.Random(derive_seed("bench-latency", 0))
    configs = [space.sample(rng) for _ in range(args.latency_configs)]
    latency_rows = validate(table, net, workload.family, input_size, device, configs, threads=args.threads)
    mae = mean_abs_pct_error(latency_rows)
    say(f"latency table: {len(table.entries)} entries, built in {build_seconds:.0f} s; MAE {mae:.1f} %")

    # ---- searches ----------------------------------------------------------------------------------
    flops = FlopsCost(net, input_size)
    largest = flops(space.largest())
    limit = args.budget_fraction * largest
    cache = CountingCache(DirectEvaluator(workload, net))
    runs = []
    for seed in [int(s) for s in args.seeds.split(",")]:
        t0 = time.perf_counter()
        settings = EvolutionSettings(evaluations=args.evaluations, population=args.population, seed=seed)
        evo = evolutionary_search(space, flops, limit, cache, settings, progress=say)
        t1 = time.perf_counter()
        rnd = random_search(space, flops, limit, cache, args.evaluations, batch=args.population, seed=seed,
                            progress=say)  # fmt: skip
        runs.append(
            {"seed": seed, "evolution": evo, "random": rnd, "seconds": (t1 - t0, time.perf_counter() - t1)}
        )

    # ---- predictor (on random-search evaluations: the first seed's, then all seeds') ---------------------
    predictor_reports = []
    pools = [runs[:1], runs] if len(runs) > 1 else [runs]
    for pool in pools:
        samples = {c.hash: c for run in pool for c in run["random"].candidates}
        predictor_reports.append(predictor_report(space, list(samples.values())))
    total = time.perf_counter() - started
    say(f"load average at end: {load()}")

    # ---- report (stdout) ----------------------------------------------------------------------------
    largest_ms = table.predict(space.largest())
    print(f"checkpoint {path}: round {loaded.round}, largest {largest:.3f} MFLOPs / {largest_ms:.2f} ms, "
          f"smallest {flops(space.smallest()):.3f} MFLOPs")  # fmt: skip
    print(
        f"budget: {limit:.3f} MFLOPs ({args.budget_fraction:g} x largest); accuracy: BN recalibration "
        f"({workload.cfg.bn_calibration_batches} batches), then all {len(workload.task.val_set)} validation images"
    )
    print()
    print(f"{'seed':>4} {'evals':>5} {'evolution best':>15} {'random best':>12} {'difference':>11} "
          f"{'evo@50%':>8} {'rnd@50%':>8} {'evo MFLOPs':>10} {'mean last 30% evo/rnd':>22} "
          f"{'seconds evo/rnd':>16}")  # fmt: skip
    met_search = True
    for run in runs:
        evo, rnd = run["evolution"], run["random"]
        half = args.evaluations // 2
        diff = 100 * (evo.best.metric - rnd.best.metric)
        met_search &= evo.best.metric >= rnd.best.metric
        print(f"{run['seed']:>4} {evo.evaluations:>5} {100 * evo.best.metric:14.2f}% {100 * rnd.best.metric:11.2f}% "
              f"{diff:+10.2f}pp {100 * best_after(evo, half):7.2f}% {100 * best_after(rnd, half):7.2f}% "
              f"{evo.best.cost:10.3f} {100 * tail_mean(evo):14.2f}%/{100 * tail_mean(rnd):.2f}% "
              f"{run['seconds'][0]:9.0f}/{run['seconds'][1]:.0f}")  # fmt: skip
    for run in runs:
        print(f"  seed {run['seed']} evolution best: {run['evolution'].best.config}")
        print(f"  seed {run['seed']} random best:    {run['random'].best.config}")
    print()
    print(f"latency model (cpu, {args.threads} torch thread, batch 1): predicted = {table.fixed_ms:.3f} ms + "
          f"{table.scale:.3f} x sum of {len(table.entries)} block entries; built in {build_seconds:.0f} s")  # fmt: skip
    errors = sorted(abs(r["error_pct"]) for r in latency_rows)
    print(f"  {len(latency_rows)} random exported sub-networks: MAE {mae:.1f} %, median {errors[len(errors) // 2]:.1f} %, "
          f"max {errors[-1]:.1f} %; measured {min(r['measured_ms'] for r in latency_rows):.2f}-"
          f"{max(r['measured_ms'] for r in latency_rows):.2f} ms")  # fmt: skip
    for report in predictor_reports:
        print(f"predictor on {report['n_train']} + {report['n_test']} held-out random-search sub-networks: "
              f"RMSE {100 * report['rmse']:.2f} pp, predicting the mean {100 * report['mean_rmse']:.2f} pp, "
              f"Kendall tau {report['kendall_tau']:.2f}")  # fmt: skip
    print(f"direct evaluations computed: {len(cache.values)} (shared between searches); total {total:.0f} s")
    ok_latency = mae <= 15.0
    print(f"targets: evolution >= random on every seed: {'MET' if met_search else 'MISSED'}; "
          f"latency MAE {mae:.1f} % <= 15 %: {'MET' if ok_latency else 'MISSED'}")  # fmt: skip
    if args.out:
        args.out.write_text(
            json.dumps(
                {
                    "checkpoint": str(path),
                    "limit_mflops": limit,
                    "largest_mflops": largest,
                    "runs": [
                        {
                            "seed": r["seed"],
                            "evolution_best": r["evolution"].best.metric,
                            "random_best": r["random"].best.metric,
                            "evolution_config": r["evolution"].best.config.to_dict(),
                            "random_config": r["random"].best.config.to_dict(),
                            "evaluated": {
                                m: [[c.config.to_json(), c.metric, c.cost] for c in r[m].candidates]
                                for m in ("evolution", "random")
                            },
                        }
                        for r in runs
                    ],
                    "latency": {
                        "mae_pct": mae,
                        "rows": latency_rows,
                        "fixed_ms": table.fixed_ms,
                        "scale": table.scale,
                    },  # fmt: skip
                    "predictor": predictor_reports,
                    "load_end": load(),
                },
                indent=2,
            )
        )
    return 0 if (met_search and ok_latency) else 1


if __name__ == "__main__":
    sys.exit(main())
