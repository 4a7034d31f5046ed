"""A worker process: one model replica on one device (a GPU, or the CPU).

The peer's agent process never touches CUDA (it forks hivemind's processes, which must not inherit a
CUDA context), so every device is driven by a worker started with the ``spawn`` method. Workers of one
host form a torch.distributed group (NCCL on GPUs, gloo on CPU) and sum their gradients there before
anything leaves the host; rank 0 hands the host's sum to the agent through shared CPU memory.

The requests and replies are the dataclasses of :mod:`peer.worker_protocol`:

- :class:`Compute`: train on this worker's sample stream of the round
  (:class:`tasks.sharding.SampleStream`) with the round's sub-networks — the same sandwich list for
  every cohort in data-parallel rounds, cohort ``cohort_rank``'s share in model-parallel ones — one
  mini-batch after another until the agent raises the shared stop flag (the swarm as a whole has
  reached the round's sample target). At least one mini-batch is always processed, and a started one
  is always finished. After every mini-batch the worker writes its sample count, loss sum and
  multiply-adds into the shared progress tensor, which the agent publishes. Then the host's workers
  sum their gradient *numerators* with torch.distributed and rank 0 leaves the sum in the shared
  gradient buffer. Reply: :class:`HostContribution`.
- :class:`Apply`: if the round committed, the shared gradient buffer now holds the swarm's average
  gradient: set it as ``.grad`` and take the optimizer step (every worker of every peer takes the
  same step from the same bytes); rank 0 copies the new state into the shared state buffer.
  Reply: :class:`Applied`.
- :class:`Load`: replace the model and optimizer state by the shared state buffer (a late joiner's
  downloaded state). Reply: :class:`Loaded`.
- :class:`Stop`: leave the process group and exit.
"""

from __future__ import annotations

import logging
import os
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from console.logs import setup_logging
from hivemind_adapter.runtime import return_free_memory, set_parent_death_signal
from peer.host_reduction import allreduce_bucketed
from peer.worker_protocol import (
    Applied,
    Apply,
    Compute,
    HostContribution,
    Load,
    Loaded,
    SharedBuffers,
    Stop,
    WorkerFailed,
)
from protocol.shards import DataSpec
from supernet.contribution import WorkerContribution, compute_contribution
from supernet.state import init_optimizer_state, load_state_tensors, state_tensors
from supernet.training.optimizer import optimizer_step
from supernet.training.schedule import cohort_configs, maybe_sort_channels, step_configs
from supernet.workload import workload_for
from tasks.shard_assignment import sample_pool
from tasks.shards.local import local_shard_task


@dataclass(frozen=True)
class WorkerLimits:
    """What a volunteer lends a worker: ``cpu_share`` of the time its training computes (it rests
    after each mini-batch so that computing takes at most that share), and at most
    ``gpu_memory_fraction`` of a GPU's memory, or ``gpu_memory_bytes`` of it (None: no cap)."""

    cpu_share: float = 1.0
    gpu_memory_fraction: float | None = None
    gpu_memory_bytes: int | None = None

    def gpu_fraction(self, total_bytes: int) -> float | None:
        """The share of a GPU of ``total_bytes`` this worker may allocate (None: no cap)."""
        if self.gpu_memory_bytes is not None:
            return min(1.0, self.gpu_memory_bytes / total_bytes)
        return self.gpu_memory_fraction

    def rest_after(self, busy_seconds: float) -> float:
        """How long to rest after computing for ``busy_seconds``."""
        return busy_seconds * (1.0 - self.cpu_share) / self.cpu_share if self.cpu_share < 1.0 else 0.0


@dataclass(frozen=True)
class WorkerSpec:
    rank: int
    world_size: int
    device: str  # "cpu" or "cuda:N"
    dist_port: int
    task_name: str
    task_seed: int
    participant: str  # f"{peer_id}/{rank}": this worker's id in the round's sharding
    train_config: dict  # supernet.training.config.TrainConfig fields
    threads: int
    # tasks on an operator's dataset: (the task's DataSpec as JSON, the directory holding manifest.json
    # and shards/, tasks.shards.local); None for built-in data
    data: tuple[str, str] | None = None
    limits: WorkerLimits = WorkerLimits()


def worker_main(spec: WorkerSpec, conn, shared: SharedBuffers) -> None:

    set_parent_death_signal()
    setup_logging()
    log = logging.getLogger(f"peer.worker{spec.rank}")
    exit_code = 0
    try:
        _serve(spec, conn, shared, log)
    except (EOFError, KeyboardInterrupt):
        pass  # the agent went away or the user pressed Ctrl-C: the agent handles the round
    except Exception as e:
        exit_code = 1
        log.error(f"worker {spec.rank} failed: {e}\n{traceback.format_exc()}")
        try:
            conn.send(WorkerFailed(f"{type(e).__name__}: {e}"))
        except OSError:
            pass
    # End here, without the interpreter's teardown: it collects the whole torch heap, which takes
    # seconds (past the agent's grace under load, then a kill), and the peer would wait for it at
    # every exit (benchmarks/RESULTS.md, "Processes that die"). Nothing is left to save: the model's
    # state lives in the agent's shared buffers, the process group is left, and the log is flushed
    # first.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(exit_code)


def _serve(spec: WorkerSpec, conn, shared: SharedBuffers, log) -> None:

    torch.set_num_threads(max(1, spec.threads))
    device = torch.device(spec.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
        # Full fp32 convolutions and matmuls (no TF32): the aggregator audits a receipt by replaying
        # its gradient on the CPU, and with TF32 a GPU peer's sketch would lie close to the audit's
        # tolerance from the replay.
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
        fraction = spec.limits.gpu_fraction(torch.cuda.get_device_properties(device).total_memory)
        if fraction is not None:
            torch.cuda.set_per_process_memory_fraction(fraction, device)
    options = {**spec.train_config, "device": str(device)}
    if spec.data is not None:
        data = DataSpec.model_validate_json(spec.data[0])
        task, manifest = local_shard_task(data, Path(spec.data[1]))
        workload = workload_for(spec.task_name, options, task=task)
        train_shards = manifest.split("train")
    else:
        workload, train_shards = workload_for(spec.task_name, options), ()
    cfg = workload.cfg
    net = workload.build().to(device)
    optimizer = workload.make_optimizer(net)
    init_optimizer_state(net, optimizer)
    params = list(net.parameters())

    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(
        backend, init_method=f"tcp://127.0.0.1:{spec.dist_port}", rank=spec.rank, world_size=spec.world_size
    )
    log.debug(f"worker {spec.rank}/{spec.world_size} on {device} ({backend})")
    try:
        while True:
            request = conn.recv()
            if isinstance(request, Stop):
                break
            if isinstance(request, Load):
                load_state_tensors(net, optimizer, [t.to(device) for t in shared.state])
                conn.send(Loaded())
            elif isinstance(request, Compute):
                pool = sample_pool(train_shards, request.data_shards) if request.data_shards else None
                conn.send(
                    _compute_host_contribution(
                        request, workload, net, optimizer, device, spec, shared, log, pool
                    )
                )
            elif isinstance(request, Apply):
                lr = None
                if request.committed:
                    for p, g in zip(params, shared.grads):
                        p.grad = g.to(device).clone()
                    lr = optimizer_step(net, optimizer, request.round_index, cfg)
                    if spec.rank == 0:
                        for dst, src in zip(shared.state, state_tensors(net, optimizer)):
                            dst.copy_(src.detach().to("cpu"))
                dist.barrier()  # the agent may read the state buffer once every worker has applied
                conn.send(Applied(lr))
                return_free_memory()  # the round's activations and batches, freed, back to the kernel
            else:
                raise ValueError(f"unknown request {request!r}")
    finally:
        dist.destroy_process_group()


def _compute_host_contribution(
    request: Compute,
    workload,
    net,
    optimizer,
    device,
    spec: WorkerSpec,
    shared: SharedBuffers,
    log,
    pool=None,
) -> HostContribution:
    """This worker's mini-batches until the agent raises the stop flag (at least one), then the host
    stage: the workers' numerators and counts summed with torch.distributed, rank 0 leaving the
    numerator in the shared gradient buffer."""
    cfg = workload.cfg
    if maybe_sort_channels(net, request.round_index, cfg, optimizer):
        log.info(f"round {request.round_index}: sorted channels by importance (width phase starts)")
    if request.mode == "model":
        configs, scale = cohort_configs(
            net, request.round_index, cfg, request.cohort_rank, request.num_cohorts
        )
    else:
        configs, scale = step_configs(net, request.round_index, cfg), 1.0

    last_batch = time.monotonic()

    def report(samples: int, loss_sum: float, macs: int) -> None:
        nonlocal last_batch
        shared.progress[spec.rank] = torch.tensor([samples, loss_sum, macs], dtype=torch.float64)
        rest = spec.limits.rest_after(time.monotonic() - last_batch)
        if rest > 0 and not int(shared.stop[0]):
            time.sleep(rest)  # the volunteer's --cpu-share
        last_batch = time.monotonic()

    work: WorkerContribution = compute_contribution(
        workload,
        net,
        configs,
        device,
        spec.task_seed,
        request.round_index,
        spec.participant,
        go_on=lambda _samples: not int(shared.stop[0]),
        on_batch=report,
        pool=pool,
    )
    allreduce_bucketed(work.numerator)  # the host stage: sum over this host's workers, in a few buckets
    if spec.rank == 0:
        for dst, src in zip(shared.grads, work.numerator):
            dst.copy_(src.to("cpu"))
    count = torch.tensor(
        [float(work.samples), work.loss_sum, float(work.macs)], device=device, dtype=torch.float64
    )
    dist.all_reduce(count)
    host_samples = int(count[0].item())
    return HostContribution(
        samples=host_samples,
        loss=count[1].item() / max(1, host_samples),
        train_macs=int(count[2].item()),
        config_hashes=tuple(c.hash for c in configs),
        scale=scale,
        worker_seconds=work.seconds,
        data_shards=request.data_shards,
    )


def default_threads(num_workers: int) -> int:
    env = os.environ.get("MANTA_WORKER_THREADS")
    if env and env.isdigit() and int(env) > 0:
        return int(env)
    return max(1, (os.cpu_count() or 1) // max(1, num_workers))
