"""How far an honest peer's gradient sketch lies from the auditor's replay: float32 rounding alone.

A peer's worker (``--peer-threads`` torch threads, 1 as a worker lent one core) and the auditor
(``--auditor-threads``) compute the same contribution: the same state, sub-networks, mini-batches
and dropout draws (:func:`supernet.contribution.compute_contribution`). Their sketches differ only by
rounding, which the gradients of convolutions under batch-norm amplify (sums that cancel heavily).
``--reference`` also computes each one in float64 and prints how far each side lies from it. The
state moves between rounds by SGD steps on the honest gradient, as a swarm's would.

Prints every draw, then the distribution of honest distances side by side with the audit's bounds
(:data:`aggregator.audits.PASS_WITHIN`, :data:`aggregator.audits.FAIL_BEYOND`) and with the
distances of a gradient rescaled by 10 % and of a made-up one.

    python -m benchmarks.audit_noise [--rounds 10] [--peers 4] [--samples 96] [--reference]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time

import torch

from aggregator.audits import FAIL_BEYOND, PASS_WITHIN
from supernet.contribution import compute_contribution, contribution_sketch
from supernet.sketch import sketch_distance
from supernet.state import init_optimizer_state
from supernet.training.schedule import step_configs
from supernet.workload import workload_for

OPTIONS = dict(
    seed=0, batch_size=32, num_subnets=2, lr=0.1, total_steps=10, width_mult=0.25, head_channels=64
)


def _as(workload, dtype):
    """``workload.accumulate`` with its inputs cast to ``dtype`` (for the float64 reference)."""
    accumulate = workload.accumulate

    def cast(net, batch, configs, device, generator):
        inputs, targets = batch
        return accumulate(net, (inputs.to(dtype), targets), configs, device, generator)

    return cast


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--peers", type=int, default=4)
    parser.add_argument("--samples", type=int, default=96, help="samples per receipt")
    parser.add_argument("--peer-threads", type=int, default=1)
    parser.add_argument("--auditor-threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--reference", action="store_true", help="also compute in float64 (8-10x slower)")
    args = parser.parse_args()
    print(f"command: python -m benchmarks.audit_noise {' '.join(sys.argv[1:])}")
    print(
        f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}; torch {torch.__version__}"
    )
    workload = workload_for("digits", OPTIONS)
    torch.manual_seed(0)
    net = workload.build()
    optimizer = workload.make_optimizer(net)
    init_optimizer_state(net, optimizer)
    seed = OPTIONS["seed"]

    def sketch_of(round_, participant, threads, dtype=torch.float32):
        torch.set_num_threads(threads)
        model = net.to(dtype)
        if dtype != torch.float32:
            object.__setattr__(workload, "accumulate", _as(workload, dtype))
        try:
            work = compute_contribution(
                workload, model, step_configs(model, round_, workload.cfg), "cpu", seed, round_,
                participant, go_on=lambda n: n < args.samples,
            )  # fmt: skip
        finally:
            if dtype != torch.float32:
                object.__delattr__(workload, "accumulate")  # the class's own again
            net.float()
        return contribution_sketch([t.float() for t in work.numerator], work.samples, seed, round_), work

    honest, rescaled, made_up, to_reference = [], [], [], []
    rng = random.Random(0)
    started = time.perf_counter()
    header = f"{'round':>5} {'peer':>4} {'peer vs auditor':>16}"
    print(header + (f" {'peer vs f64':>12} {'auditor vs f64':>15}" if args.reference else ""))
    for round_ in range(args.rounds):
        step = None
        for p in range(args.peers):
            participant = f"peer-{p}/0"
            claimed, work = sketch_of(round_, participant, args.peer_threads)
            replay, _ = sketch_of(round_, participant, args.auditor_threads)
            honest.append(sketch_distance(claimed, replay))
            rescaled.append(sketch_distance([1.1 * v for v in claimed], replay))
            scale = max(abs(v) for v in claimed)
            made_up.append(sketch_distance([rng.uniform(-scale, scale) for _ in claimed], replay))
            row = f"{round_:>5} {p:>4} {honest[-1]:>16.4f}"
            if args.reference:
                truth, _ = sketch_of(round_, participant, args.auditor_threads, torch.float64)
                to_reference.append((sketch_distance(claimed, truth), sketch_distance(replay, truth)))
                row += f" {to_reference[-1][0]:>12.4f} {to_reference[-1][1]:>15.4f}"
            print(row, flush=True)
            step = work.numerator if step is None else [a + b for a, b in zip(step, work.numerator)]
        with torch.no_grad():  # the swarm's step on the honest mean gradient
            for param, total in zip(net.parameters(), step):
                param.grad = total / (args.peers * args.samples)
        optimizer.step()

    def quantiles(values):
        ordered = sorted(values)
        pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
        return f"median {statistics.median(ordered):.4f}  p90 {pick(0.9):.4f}  max {ordered[-1]:.4f}"

    n = len(honest)
    print(f"\n{n} receipts in {time.perf_counter() - started:.0f} s; load average {os.getloadavg()[0]:.2f}")
    print(f"audit bounds: passes within {PASS_WITHIN}, fails beyond {FAIL_BEYOND}, marginal between")
    print(f"honest (peer {args.peer_threads} thread(s), auditor {args.auditor_threads}): {quantiles(honest)}")
    over = sum(d > PASS_WITHIN for d in honest)
    print(f"  marginal: {over} of {n}; failed: {sum(d > FAIL_BEYOND for d in honest)} of {n}")
    if to_reference:
        print(f"peer vs float64:    {quantiles([a for a, _ in to_reference])}")
        print(f"auditor vs float64: {quantiles([b for _, b in to_reference])}")
    print(f"rescaled by 10 %:   {quantiles(rescaled)}  (min {min(rescaled):.4f})")
    print(f"made up:            {quantiles(made_up)}  (min {min(made_up):.4f})")
    print(
        f"ratio of the smallest made-up distance to the largest honest one: {min(made_up) / max(honest):.1f}"
    )


if __name__ == "__main__":
    main()
