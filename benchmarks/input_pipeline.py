"""A worker's samples/s with the background input pipeline, against the bare model step, in one run.

On an image-folder dataset the script writes itself (``--images`` real PNG files, 10 classes, read
through ``tasks.get_task("imagefolder", ...)``: PIL decode, resize, normalise, then the task's random
crop as augmentation), with the real :class:`supernet.workload.Workload` and sandwich step
(:func:`supernet.training.schedule.step_configs`, :meth:`Workload.accumulate`), three ways:

(a) bare step:  the model step on batches already decoded, augmented and on the device (the ceiling);
(b) synchronous: :func:`supernet.contribution.compute_contribution` with ``prefetch=0``: every batch
    decoded and augmented in the training loop, then trained on;
(c) pipeline:   ``compute_contribution`` with the background pipeline, two batches ahead, decoding in
    ``--decode-threads`` threads, or (c') in as many forked processes, or (c'') in the producer thread
    alone; collation and augmentation in the producer thread. compute_contribution's default is (c') on
    a GPU (c'' where the process is a daemon and may not fork), and (b) on the CPU.

Also "input only": the synchronous input path with no model step, the rate the loader alone manages.

Then the host stage: a worker group of 2 processes (gloo on CPU; NCCL when 2 GPUs are visible) sums
the supernet's gradient list one ``all_reduce`` per tensor, against
:func:`peer.host_reduction.allreduce_bucketed` (25 MiB buckets).

Absolute figures depend on the machine and its load; the ratios are the point. Nothing is asserted.

    python -m benchmarks.input_pipeline [--device cpu|cuda] [--batches 30] [--images 3000]
        [--decode-threads N] [--batch-size 64] [--width-mult 0.5] [--png-size 32]
"""

from __future__ import annotations

import argparse
import os
import shlex
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from peer.host_reduction import DEFAULT_BUCKET_BYTES, allreduce_bucketed
from supernet.batch_prefetch import default_decode_threads
from supernet.contribution import compute_contribution
from supernet.training.build import build_supernet
from supernet.training.schedule import step_configs
from supernet.workload import train_config, workload_for
from tasks.sharding import SampleStream


def write_image_folder(root: Path, images: int, size: int, classes: int = 10) -> None:
    """``images`` PNG files of ``size``×``size`` in ``classes`` class folders: a class colour, a
    gradient and noise (so they compress, and decode, like photographs more than like flat colour)."""
    from PIL import Image

    rng = np.random.default_rng(0)
    ramp = np.linspace(0, 1, size)[None, :, None] * np.linspace(0, 1, size)[:, None, None]
    for c in range(classes):
        (root / f"class{c:02d}").mkdir(parents=True, exist_ok=True)
    colours = rng.uniform(40, 215, size=(classes, 3))
    for i in range(images):
        c = i % classes
        pixels = colours[c] * (0.5 + ramp) + rng.normal(0, 25, size=(size, size, 3))
        Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(
            root / f"class{c:02d}" / f"{i:05d}.png"
        )


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def bare_step(workload, net, configs, device, batches: list) -> float:
    """Seconds for the model steps (and the numerator sums) on batches already on the device."""
    generator = torch.Generator().manual_seed(1)
    params = list(net.parameters())
    numerator = [torch.zeros_like(p) for p in params]
    _sync(device)
    started = time.perf_counter()
    for batch in batches:
        workload.accumulate(net, batch, configs, device, generator)
        for acc, p in zip(numerator, params):
            acc.add_(p.grad, alpha=workload.cfg.batch_size)
    _sync(device)
    return time.perf_counter() - started


def input_only(workload, count: int) -> float:
    """Seconds to load and augment ``count`` batches in the loop, no model step."""
    generator = torch.Generator().manual_seed(1)
    stream = SampleStream(len(workload.task.train_set), 3, 0, "bench/input")
    started = time.perf_counter()
    for _ in range(count):
        workload.batch(stream.take(workload.cfg.batch_size), generator)
    return time.perf_counter() - started


def contribution(workload, net, configs, device, samples: int, participant: str, **options) -> float:
    _sync(device)
    started = time.perf_counter()
    work = compute_contribution(
        workload, net, configs, device, 3, 0, participant, go_on=lambda n: n < samples, **options
    )
    _sync(device)
    assert work.samples == samples
    return time.perf_counter() - started


# ---------------------------------------------------------------------------- the host stage


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _reduce_rank(rank: int, port: int, backend: str, options: dict, repeats: int, results) -> None:
    torch.set_num_threads(1)
    device = torch.device(f"cuda:{rank}" if backend == "nccl" else "cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        net = build_supernet(train_config("imagefolder", options), 10, 3)  # as the benchmark's task
        generator = torch.Generator().manual_seed(rank)
        grads = [torch.randn(p.shape, generator=generator).to(device) for p in net.parameters()]
        times: dict[str, list[float]] = {"per tensor": [], "bucketed": []}
        counts: dict[str, int] = {}
        for _ in range(repeats + 1):  # the first round warms up
            for name in ("per tensor", "bucketed"):
                tensors = [g.clone() for g in grads]
                _sync(device)
                dist.barrier()
                started = time.perf_counter()
                if name == "per tensor":
                    for t in tensors:
                        dist.all_reduce(t)
                    counts[name] = len(tensors)
                else:
                    counts[name] = allreduce_bucketed(tensors, DEFAULT_BUCKET_BYTES)
                _sync(device)
                times[name].append(time.perf_counter() - started)
        if rank == 0:
            numel = sum(g.numel() for g in grads)
            results.put((len(grads), numel, counts, {k: v[1:] for k, v in times.items()}))
    finally:
        dist.destroy_process_group()


def host_reduction(options: dict, repeats: int) -> tuple[str, tuple]:
    backend = "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= 2 else "gloo"
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = _free_port()
    procs = [
        ctx.Process(target=_reduce_rank, args=(r, port, backend, options, repeats, results), daemon=True)
        for r in range(2)
    ]
    for p in procs:
        p.start()
    try:
        answer = results.get(timeout=300)
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    return backend, answer


# ---------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--batches", type=int, default=30, help="timed mini-batches per measurement")
    parser.add_argument("--images", type=int, default=3000)
    parser.add_argument("--png-size", type=int, default=32, help="stored image side (resized to 32)")
    parser.add_argument("--decode-threads", type=int, default=default_decode_threads())
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--width-mult", type=float, default=0.5)
    parser.add_argument("--subnets", type=int, default=2, help="sub-networks per sandwich step")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each measurement (median)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: leave the default)")
    parser.add_argument("--reduce-repeats", type=int, default=5)
    parser.add_argument("--data-dir", default=None, help="reuse (or keep) the generated images here")
    args = parser.parse_args()

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type == "cuda":  # as the worker runs (peer/worker.py): full fp32, no TF32
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
    print(f"command: python -m benchmarks.input_pipeline {' '.join(shlex.quote(a) for a in sys.argv[1:])}")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(
        f"machine: {os.cpu_count()} cores, torch {torch.__version__}, {torch.get_num_threads()} torch "
        f"threads, device {device} ({name}), load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )

    with tempfile.TemporaryDirectory(prefix="manta-input-bench-") as tmp:
        root = Path(args.data_dir or tmp)
        if not any(root.glob("class*/*.png")):
            started = time.perf_counter()
            write_image_folder(root, args.images, args.png_size)
            print(
                f"wrote {args.images} PNGs of {args.png_size}x{args.png_size} in {time.perf_counter() - started:.1f} s"
            )
        options = dict(
            width_mult=args.width_mult,
            batch_size=args.batch_size,
            num_subnets=args.subnets,
            device=str(device),
            task_options={"data_dir": str(root), "image_size": 32, "hflip": True},
        )
        workload = workload_for("imagefolder", options)
        net = workload.build().to(device)
        configs = step_configs(net, 0, workload.cfg)
        samples = args.batches * args.batch_size

        # warm-up: the first batches (cuDNN's choices, allocator, page cache of the PNGs)
        contribution(workload, net, configs, device, 3 * args.batch_size, "bench/warm")
        stream = SampleStream(len(workload.task.train_set), 3, 0, "bench/bare")
        generator = torch.Generator().manual_seed(0)
        preloaded = []
        for _ in range(args.batches):
            inputs, targets = workload.batch(stream.take(args.batch_size), generator)
            preloaded.append((inputs.to(device), targets.to(device)))

        modes = {
            "threads": dict(prefetch=2, decode_threads=args.decode_threads, decode_processes=0),
            "processes": dict(prefetch=2, decode_processes=args.decode_threads),
            "producer": dict(prefetch=2, decode_threads=0, decode_processes=0),
        }
        rates: dict[str, list[float]] = {"bare": [], "sync": [], "input": [], **{m: [] for m in modes}}
        for r in range(args.repeats):  # interleaved, so a change of load hits every mode alike
            rates["bare"].append(samples / bare_step(workload, net, configs, device, preloaded))
            rates["sync"].append(
                samples / contribution(workload, net, configs, device, samples, f"bench/{r}", prefetch=0)
            )
            for mode, options in modes.items():
                rates[mode].append(
                    samples / contribution(workload, net, configs, device, samples, f"bench/{r}", **options)
                )
            rates["input"].append(samples / input_only(workload, args.batches))
        rate = {k: statistics.median(v) for k, v in rates.items()}

    print()
    print(
        f"input pipeline: imagefolder, {args.images} PNGs {args.png_size}px -> 32px, batch {args.batch_size}, "
        f"{args.subnets} sub-networks per step, width {args.width_mult}, {args.batches} batches x "
        f"{args.repeats} runs (median), decode threads {args.decode_threads}"
    )
    print("| | samples/s | / bare step |")
    print("|---|---:|---:|")
    print(f"| (a) bare model step, batches preloaded on {device} | {rate['bare']:.0f} | 1.00 |")
    print(
        f"| (b) synchronous input in the loop (before) | {rate['sync']:.0f} | {rate['sync'] / rate['bare']:.2f} |"
    )
    n = args.decode_threads
    rows = [
        (f"(c) background pipeline, {n} decoding threads", "threads"),
        (f"(c') background pipeline, {n} decoding processes", "processes"),
        ("(c'') background pipeline, producer thread only", "producer"),
        ("input only (decode + augment, no step)", "input"),
    ]
    for label, key in rows:
        print(f"| {label} | {rate[key]:.0f} | {rate[key] / rate['bare']:.2f} |")
    default = "processes" if device.type == "cuda" else "sync"
    print(f"worker's default ({default}) / synchronous: {rate[default] / rate['sync']:.2f}x", flush=True)

    reduce_options = dict(width_mult=args.width_mult, num_subnets=args.subnets)
    backend, (tensors, numel, counts, times) = host_reduction(reduce_options, args.reduce_repeats)
    per, bucketed = statistics.median(times["per tensor"]), statistics.median(times["bucketed"])
    print()
    print(
        f"host reduction: 2 processes, {backend}, the supernet's gradient list ({tensors} tensors, "
        f"{numel * 4 / 2**20:.2f} MiB float32), median of {args.reduce_repeats}"
    )
    print("| | collectives | ms | / per tensor |")
    print("|---|---:|---:|---:|")
    print(f"| one all_reduce per tensor (before) | {counts['per tensor']} | {per * 1e3:.2f} | 1.00 |")
    print(
        f"| bucketed, {DEFAULT_BUCKET_BYTES >> 20} MiB (now) | {counts['bucketed']} | {bucketed * 1e3:.2f} | "
        f"{bucketed / per:.2f} |"
    )
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
