"""One worker's training samples/s: MANTA's round path against a plain PyTorch loop, in one run.

Both train the same digits supernet (width, head, batch size and K sub-networks as given) on the same
device, round after round, with the same sandwich of sub-networks per round
(:func:`supernet.training.schedule.step_configs` at the same round numbers; the run checks the worker reports
the same configuration hashes):

(a) plain loop: per mini-batch, each sub-network's forward, loss (in-place distillation from the
    largest, as the sandwich rule does) and backward, then one optimizer step. The mini-batches are
    made once and already lie on the device: the ceiling, with no input pipeline and no bookkeeping.
(b) MANTA's worker: a real :class:`peer.worker_pool.WorkerPool` (one spawned worker process on the
    device, :mod:`peer.worker`) computing rounds as a peer's agent drives them: ``Compute`` (its own
    sample stream, augmentation and input pipeline, per-sample gradient sums, progress reports),
    the stop flag raised once the round has its samples, the host reduction into shared memory,
    then ``Apply`` (the optimizer step from the shared gradient buffer). Two rates: over the
    worker's own time in its mini-batches (``HostContribution.worker_seconds``, the steady state),
    and over the whole round seen from the agent (``Compute`` sent to ``Applied`` received, so
    every per-round cost is in it).

The plain loop steps the optimizer after every mini-batch, the worker once per round: (a) does a
little more work per sample. The rounds, plain and worker, alternate, so a change of load hits both.
Absolute figures depend on the machine and its load; the ratio is the point. Nothing is asserted.

    python -m benchmarks.worker_throughput [--device cpu|cuda] [--batch-size 64] [--subnets 4]
        [--round-batches 16] [--rounds 5] [--warmup-rounds 1] [--width-mult 0.5] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import NoReturn

import torch
import torch.nn.functional as F

from peer.devices import WorkerDevice
from peer.worker import default_threads
from peer.worker_pool import WorkerPool
from peer.worker_protocol import Compute, SharedBuffers
from supernet.config import SubnetConfig
from supernet.state import fresh_state_tensors
from supernet.training.config import TrainConfig
from supernet.training.schedule import step_configs
from supernet.workload import Workload, workload_for
from tasks.sharding import SampleStream

TASK = "digits"
TASK_SEED = 7
FIRST_ROUND = 100  # any round of the single-stage sandwich schedule (total_steps below)
AGENT_POLL_SECONDS = 0.005  # the agent's look at the workers' progress (a peer looks every 0.25 s)


@dataclass(frozen=True)
class RoundTiming:
    """One worker round seen from both sides."""

    samples: int
    worker_seconds: float  # the worker's own time in its mini-batches
    round_seconds: float  # Compute sent to Applied received, as the agent sees it
    config_hashes: tuple[str, ...]


@dataclass(frozen=True)
class Result:
    """What the run measured (the medians over the timed rounds), for ``--json``."""

    command: str
    machine: str
    device: str
    batch_size: int
    subnets: int
    round_batches: int
    rounds: int
    plain_samples_per_s: float
    worker_samples_per_s: float  # in the worker's mini-batches
    round_samples_per_s: float  # over whole rounds
    worker_vs_plain: float
    round_vs_plain: float
    round_overhead_ms: float  # whole round minus the worker's mini-batches
    samples_per_round: float
    same_subnets: bool
    load_before: float
    load_after: float


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def preloaded_batches(workload: Workload, count: int, device: torch.device) -> list:
    """``count`` augmented mini-batches of the task's training set, already on ``device``."""
    generator = torch.Generator().manual_seed(1)
    stream = SampleStream(len(workload.task.train_set), TASK_SEED, 0, "bench/plain")
    batches = []
    for _ in range(count):
        inputs, targets = workload.batch(stream.take(workload.cfg.batch_size), generator)
        batches.append((inputs.to(device), targets.to(device)))
    return batches


def plain_step(
    net: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: tuple[torch.Tensor, torch.Tensor],
    configs: list[SubnetConfig],
    cfg: TrainConfig,
) -> None:
    """One sandwich step the way a plain training loop writes it: the same losses as
    :func:`supernet.training.gradients.accumulate_sandwich`, no bookkeeping, then ``optimizer.step()``."""
    inputs, targets = batch
    temperature = cfg.distill_temperature
    optimizer.zero_grad(set_to_none=True)
    teacher = None
    largest = net.largest_config()
    if cfg.distill and configs[0] != largest:
        with torch.no_grad():
            net.set_active(largest)
            teacher = F.softmax(net(inputs) / temperature, dim=1)
    for sub in configs:
        net.set_active(sub)
        logits = net(inputs)
        loss = F.cross_entropy(logits, targets, label_smoothing=cfg.label_smoothing)
        if cfg.distill and sub != largest:
            log_probs = F.log_softmax(logits / temperature, dim=1)
            distill = -(teacher * log_probs).sum(dim=1).mean() * temperature**2
            loss = cfg.student_label_weight * loss + cfg.distill_weight * distill
        elif cfg.distill and teacher is None:
            teacher = F.softmax(logits.detach() / temperature, dim=1)
        loss.backward()
    optimizer.step()


def plain_round(net, optimizer, batches: list, configs: list[SubnetConfig], cfg, device) -> float:
    """Seconds for one round's mini-batches in the plain loop."""
    _sync(device)
    started = time.perf_counter()
    for batch in batches:
        plain_step(net, optimizer, batch, configs, cfg)
    _sync(device)
    return time.perf_counter() - started


def worker_round(pool: WorkerPool, round_index: int, target_samples: int, batch_size: int) -> RoundTiming:
    """One round as a peer's agent drives it: compute until the round has ``target_samples`` (the
    stop flag raised one mini-batch ahead, so the worker ends on the target), then apply the mean."""
    started = time.perf_counter()
    pool.start_compute(Compute(round_index, "data", 0, 1))
    while (host := pool.computed(timeout=AGENT_POLL_SECONDS)) is None:
        if not pool.stop_flag_raised and pool.progress()[0] >= target_samples - batch_size:
            pool.raise_stop_flag()
    computed = time.perf_counter()
    mean = [g / max(1, host.samples) for g in pool.host_numerator()]  # the swarm's average stands in
    averaged = time.perf_counter()  # the averaging is the agent's and the network's, not the worker's
    pool.apply(round_index, mean)
    applied = time.perf_counter()
    round_seconds = (computed - started) + (applied - averaged)
    return RoundTiming(host.samples, host.worker_seconds, round_seconds, host.config_hashes)


def machine_line(device: torch.device) -> str:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    return (
        f"{os.cpu_count()} cores, torch {torch.__version__}, device {device} ({name}), "
        f"{torch.get_num_threads()} torch threads"
    )


class OneLineErrorParser(argparse.ArgumentParser):
    """Bad input is one line and exit status 2, without the usage block."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = OneLineErrorParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--subnets", type=int, default=4, help="K sub-networks per round (sandwich)")
    parser.add_argument("--width-mult", type=float, default=0.5)
    parser.add_argument("--head-channels", type=int, default=128)
    parser.add_argument("--round-batches", type=int, default=16, help="mini-batches per round")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds of each (median)")
    parser.add_argument("--warmup-rounds", type=int, default=1)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: the worker's default)")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args(argv)
    for name in ("batch_size", "subnets", "round_batches", "rounds"):
        if getattr(args, name) < (2 if name == "batch_size" else 1):
            parser.error(f"--{name.replace('_', '-')} is too small: {getattr(args, name)}")
    if args.warmup_rounds < 0 or args.threads < 0 or args.width_mult <= 0:
        parser.error("--warmup-rounds and --threads must be >= 0, --width-mult positive")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is visible")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    device = torch.device("cuda:0" if args.device == "cuda" else "cpu")
    if args.threads:
        os.environ["MANTA_WORKER_THREADS"] = str(args.threads)
    torch.set_num_threads(default_threads(1))  # what the worker takes (MANTA_WORKER_THREADS or all)
    if device.type == "cuda":  # as the worker runs (peer/worker.py): full fp32, no TF32
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
    command = "python -m benchmarks.worker_throughput " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    load_before = os.getloadavg()[0]
    machine = machine_line(device)
    print(f"command: {command}")
    print(f"machine: {machine}, load average {load_before:.2f}", flush=True)

    options = dict(
        seed=0,
        batch_size=args.batch_size,
        num_subnets=args.subnets,
        lr=0.05,
        total_steps=FIRST_ROUND + 1000,
        schedule="sandwich",
        width_mult=args.width_mult,
        head_channels=args.head_channels,
    )
    workload = workload_for(TASK, {**options, "device": str(device)})
    cfg = workload.cfg
    net = workload.build().to(device)
    optimizer = workload.make_optimizer(net)
    batches = preloaded_batches(workload, args.round_batches, device)

    agent_net = workload_for(TASK, options).build()  # the agent's copy, on the CPU (as peer/node.py)
    shared = SharedBuffers.create(
        list(agent_net.parameters()), fresh_state_tensors(agent_net, cfg.optimizer), 1
    )
    kind = device.type
    pool = WorkerPool(
        [WorkerDevice(kind, 0, kind, 0)],
        shared,
        task_name=TASK,
        task_seed=TASK_SEED,
        participant_prefix="bench",
        train_options=options,
    )
    target = args.round_batches * args.batch_size
    plain_rates, worker_rates, round_rates, overheads, sizes = [], [], [], [], []
    same = True
    try:
        for i in range(args.warmup_rounds + args.rounds):
            r = FIRST_ROUND + i
            configs = step_configs(net, r, cfg)
            plain_seconds = plain_round(net, optimizer, batches, configs, cfg, device)
            timing = worker_round(pool, r, target, args.batch_size)
            same = same and timing.config_hashes == tuple(c.hash for c in configs)
            timed = i >= args.warmup_rounds
            label = "round" if timed else "warm-up"
            print(
                f"  {label} {r}: plain {target / plain_seconds:.0f}/s, worker {timing.samples} samples "
                f"in {timing.worker_seconds:.3f} s ({timing.samples / timing.worker_seconds:.0f}/s), "
                f"whole round {timing.round_seconds:.3f} s",
                file=sys.stderr,
                flush=True,
            )
            if timed:
                plain_rates.append(target / plain_seconds)
                worker_rates.append(timing.samples / timing.worker_seconds)
                round_rates.append(timing.samples / timing.round_seconds)
                overheads.append(timing.round_seconds - timing.worker_seconds)
                sizes.append(timing.samples)
    finally:
        pool.stop()

    plain, worker, whole = (statistics.median(v) for v in (plain_rates, worker_rates, round_rates))
    result = Result(
        command=command,
        machine=machine,
        device=str(device),
        batch_size=args.batch_size,
        subnets=args.subnets,
        round_batches=args.round_batches,
        rounds=args.rounds,
        plain_samples_per_s=round(plain, 1),
        worker_samples_per_s=round(worker, 1),
        round_samples_per_s=round(whole, 1),
        worker_vs_plain=round(worker / plain, 3),
        round_vs_plain=round(whole / plain, 3),
        round_overhead_ms=round(statistics.median(overheads) * 1e3, 1),
        samples_per_round=statistics.median(sizes),
        same_subnets=same,
        load_before=round(load_before, 2),
        load_after=round(os.getloadavg()[0], 2),
    )
    print_table(result, args)
    if args.json is not None:
        args.json.write_text(json.dumps(asdict(result), indent=2) + "\n")


def print_table(r: Result, args: argparse.Namespace) -> None:
    print()
    print(
        f"worker throughput: {TASK}, width {args.width_mult}, head {args.head_channels}, batch {r.batch_size}, "
        f"K = {r.subnets} sub-networks (sandwich), rounds of {r.round_batches} mini-batches, "
        f"{r.rounds} timed rounds after {args.warmup_rounds} warm-up (median), on {r.device}"
    )
    print("| | samples/s | / plain loop |")
    print("|---|---:|---:|")
    print(f"| (a) plain PyTorch loop, batches on the device | {r.plain_samples_per_s:.0f} | 1.00 |")
    print(
        f"| (b) MANTA worker, in its mini-batches | {r.worker_samples_per_s:.0f} | {r.worker_vs_plain:.2f} |"
    )
    print(
        f"| (b) MANTA worker, whole rounds (Compute to Applied) | {r.round_samples_per_s:.0f} | "
        f"{r.round_vs_plain:.2f} |"
    )
    print(
        f"per-round cost beyond the mini-batches: {r.round_overhead_ms:.1f} ms "
        f"({r.samples_per_round:.0f} samples per round); same sub-networks in both: {r.same_subnets}"
    )
    print(f"load average: {r.load_before:.2f} before, {r.load_after:.2f} after", flush=True)


if __name__ == "__main__":
    main()
