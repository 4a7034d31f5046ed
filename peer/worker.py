"""A worker process: one model replica on one device (a GPU, or the CPU).

The peer's agent process never touches CUDA (it forks hivemind's processes, which must not inherit a
CUDA context), so every device is driven by a worker started with the ``spawn`` method. Workers of one
host form a torch.distributed group (NCCL on GPUs, gloo on CPU) and sum their gradients there before
anything leaves the host; rank 0 hands the host's sum to the agent through shared CPU memory.

Protocol (agent -> worker over a pipe; every request gets one reply):

- ``("compute", round, mode, cohort_rank, num_cohorts)``: train on this worker's sample stream of the
  round (:class:`tasks.sharding.SampleStream`) with the round's sub-networks — the same sandwich list
  for every cohort in data-parallel rounds, cohort ``cohort_rank``'s share in model-parallel ones —
  one mini-batch after another until the agent raises the shared stop flag (the swarm as a whole has
  reached the round's sample target). At least one mini-batch is always processed, and a started one
  is always finished. After every mini-batch the worker writes its sample count, loss sum and
  multiply-adds into the shared progress tensor, which the agent publishes. Then the host's workers
  sum their gradient *numerators* (sum over samples of the per-sample gradient) with torch.distributed
  and rank 0 leaves the sum in the shared gradient buffer. Reply: ``("computed", stats)``.
- ``("apply", round, committed)``: if the round committed, the shared gradient buffer now holds the
  swarm's average gradient: set it as ``.grad`` and take the optimizer step (every worker of every
  peer takes the same step from the same bytes); rank 0 copies the new state into the shared state
  buffer. Reply: ``("applied", lr)``.
- ``("load",)``: replace the model and optimizer state by the shared state buffer (a late joiner's
  downloaded state). Reply: ``("loaded",)``.
- ``("stop",)``: leave the process group and exit.
"""

from __future__ import annotations

import logging
import os
import traceback
from dataclasses import dataclass

import torch
import torch.distributed as dist

from console.logs import setup_logging
from hivemind_adapter.runtime import set_parent_death_signal
from supernet.contribution import WorkerContribution, compute_contribution
from supernet.state import init_optimizer_state, load_state_tensors, state_tensors
from supernet.training import cohort_configs, maybe_sort_channels, optimizer_step, step_configs
from supernet.workload import workload_for


@dataclass(frozen=True)
class WorkerSpec:
    rank: int
    world_size: int
    device: str  # "cpu" or "cuda:N"
    dist_port: int
    task_name: str
    task_seed: int
    participant: str  # f"{peer_id}/{rank}": this worker's id in the round's sharding
    train_config: dict  # supernet.training.TrainConfig fields
    threads: int


@dataclass
class SharedBuffers:
    """The memory the agent and its workers share (all CPU tensors in shared memory)."""

    grads: list[torch.Tensor]  # the host's gradient numerator out, the swarm's average in
    state: list[torch.Tensor]  # the model state (supernet.state layout) after the last applied round
    stop: torch.Tensor  # int64 [1]: the agent sets it to 1 to close the round's computation
    progress: torch.Tensor  # float64 [world, 3]: samples, loss sum, multiply-adds so far this round

    @classmethod
    def create(cls, grads_like: list[torch.Tensor], state: list[torch.Tensor], world: int) -> SharedBuffers:
        return cls(
            # Contiguous whatever the model's memory format (the stereo supernet is channels-last):
            # hivemind flattens tensors with .view(-1), which only works on contiguous ones.
            [torch.zeros(g.shape, dtype=g.dtype).share_memory_() for g in grads_like],
            [t.detach().cpu().contiguous().clone().share_memory_() for t in state],
            torch.zeros(1, dtype=torch.int64).share_memory_(),
            torch.zeros(world, 3, dtype=torch.float64).share_memory_(),
        )


def worker_main(spec: WorkerSpec, conn, shared: SharedBuffers) -> None:

    set_parent_death_signal()
    setup_logging()
    log = logging.getLogger(f"peer.worker{spec.rank}")
    try:
        _serve(spec, conn, shared, log)
    except (EOFError, KeyboardInterrupt):
        pass  # the agent went away or the user pressed Ctrl-C: the agent handles the round
    except Exception as e:
        log.error(f"worker {spec.rank} failed: {e}\n{traceback.format_exc()}")
        try:
            conn.send(("error", f"{type(e).__name__}: {e}"))
        except OSError:
            pass


def _serve(spec: WorkerSpec, conn, shared: SharedBuffers, log) -> None:

    torch.set_num_threads(max(1, spec.threads))
    device = torch.device(spec.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    workload = workload_for(spec.task_name, {**spec.train_config, "device": str(device)})
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
            msg = conn.recv()
            kind = msg[0]
            if kind == "stop":
                break
            if kind == "load":
                load_state_tensors(net, optimizer, [t.to(device) for t in shared.state])
                conn.send(("loaded",))
            elif kind == "compute":
                _, round_index, mode, cohort_rank, num_cohorts = msg
                if maybe_sort_channels(net, round_index, cfg, optimizer):
                    log.info(f"round {round_index}: sorted channels by importance (width phase starts)")
                if mode == "model":
                    configs, scale = cohort_configs(net, round_index, cfg, cohort_rank, num_cohorts)
                else:
                    configs, scale = step_configs(net, round_index, cfg), 1.0
                work = _compute(workload, net, configs, device, spec, round_index, shared)
                numerator = work.numerator
                for t in numerator:
                    dist.all_reduce(t)  # the host stage: sum over this host's workers
                if spec.rank == 0:
                    for dst, src in zip(shared.grads, numerator):
                        dst.copy_(src.to("cpu"))
                count = torch.tensor(
                    [float(work.samples), work.loss_sum, float(work.macs)],
                    device=device,
                    dtype=torch.float64,
                )
                dist.all_reduce(count)
                host_samples = int(count[0].item())
                conn.send(
                    (
                        "computed",
                        dict(
                            samples=host_samples,
                            loss=count[1].item() / max(1, host_samples),
                            train_macs=int(count[2].item()),
                            config_hashes=[c.hash for c in configs],
                            scale=scale,
                            seconds=work.seconds,
                        ),
                    )
                )
            elif kind == "apply":
                _, round_index, committed = msg
                lr = None
                if committed:
                    for p, g in zip(params, shared.grads):
                        p.grad = g.to(device).clone()
                    lr = optimizer_step(net, optimizer, round_index, cfg)
                    if spec.rank == 0:
                        for dst, src in zip(shared.state, state_tensors(net, optimizer)):
                            dst.copy_(src.detach().to("cpu"))
                dist.barrier()  # the agent may read the state buffer once every worker has applied
                conn.send(("applied", lr))
            else:
                raise ValueError(f"unknown request {kind!r}")
    finally:
        dist.destroy_process_group()


def _compute(workload, net, configs, device, spec, round_index, shared) -> WorkerContribution:
    """Mini-batches from this worker's stream until the agent raises the stop flag (at least one)."""

    def report(samples: int, loss_sum: float, macs: int) -> None:
        shared.progress[spec.rank] = torch.tensor([samples, loss_sum, macs], dtype=torch.float64)

    return compute_contribution(
        workload,
        net,
        configs,
        device,
        spec.task_seed,
        round_index,
        spec.participant,
        go_on=lambda _samples: not int(shared.stop[0]),
        on_batch=report,
    )


def default_threads(num_workers: int) -> int:
    env = os.environ.get("MANTA_WORKER_THREADS")
    if env and env.isdigit() and int(env) > 0:
        return int(env)
    return max(1, (os.cpu_count() or 1) // max(1, num_workers))
