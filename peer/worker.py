"""A worker process: one model replica on one device (a GPU, or the CPU).

The peer's agent process never touches CUDA (it forks hivemind's processes, which must not inherit a
CUDA context), so every device is driven by a worker started with the ``spawn`` method. Workers of one
host form a torch.distributed group (NCCL on GPUs, gloo on CPU) and sum their gradients there before
anything leaves the host; rank 0 hands the host's sum to the agent through shared CPU memory.

Protocol (agent -> worker over a pipe; every request gets one reply):

- ``("compute", round, participants, round_size)``: train on this worker's shard of the round — the
  sandwich-rule sub-networks of the round, gradients summed over mini-batches and sub-networks — and
  leave the host's gradient *numerator* (sum over samples of the per-sample gradient) in the shared
  gradient buffer. Reply: ``("computed", stats)``.
- ``("apply", round, committed)``: if the round committed, the shared gradient buffer now holds the
  swarm's average gradient: set it as ``.grad`` and take the optimizer step (every worker of every
  peer takes the same step from the same bytes); rank 0 copies the new state into the shared state
  buffer. Reply: ``("applied", lr)``.
- ``("load",)``: replace the model and optimizer state by the shared state buffer (a late joiner's
  downloaded state). Reply: ``("loaded",)``.
- ``("stop",)``: leave the process group and exit.
"""

from __future__ import annotations

import os
import traceback
from dataclasses import dataclass

import torch


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


def worker_main(spec: WorkerSpec, conn, grad_buf: list[torch.Tensor], state_buf: list[torch.Tensor]) -> None:
    from protocol.logs import get_logger, setup_logging
    from protocol.runtime import set_parent_death_signal

    set_parent_death_signal()
    setup_logging()
    log = get_logger(f"peer.worker{spec.rank}")
    try:
        _serve(spec, conn, grad_buf, state_buf, log)
    except (EOFError, KeyboardInterrupt):
        pass  # the agent went away or the user pressed Ctrl-C: the agent handles the round
    except Exception as e:
        log.error(f"worker {spec.rank} failed: {e}\n{traceback.format_exc()}")
        try:
            conn.send(("error", f"{type(e).__name__}: {e}"))
        except OSError:
            pass


def _serve(spec: WorkerSpec, conn, grad_buf, state_buf, log) -> None:
    import torch.distributed as dist

    from supernet.state import init_optimizer_state, load_state_tensors, state_tensors
    from supernet.training import (
        TrainConfig,
        accumulate_gradients,
        batch_for_step,
        build_supernet,
        make_optimizer,
        optimizer_step,
        step_configs,
    )
    from tasks import get_task
    from tasks.sharding import shard_indices

    torch.set_num_threads(max(1, spec.threads))
    device = torch.device(spec.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    cfg = TrainConfig(**spec.train_config)
    task = get_task(spec.task_name)
    in_channels = task.train_set[0][0].shape[0]
    net = build_supernet(cfg, task.num_classes, in_channels).to(device)
    optimizer = make_optimizer(net, cfg)
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
                load_state_tensors(net, optimizer, [t.to(device) for t in state_buf])
                conn.send(("loaded",))
            elif kind == "compute":
                _, round_index, participants, round_size = msg
                indices = shard_indices(
                    len(task.train_set),
                    spec.task_seed,
                    round_index,
                    participants,
                    spec.participant,
                    round_size,
                )
                configs = step_configs(net, round_index, cfg)
                numerator = [torch.zeros_like(p) for p in params]
                loss_sum, samples, macs = 0.0, 0, 0
                for start in range(0, len(indices), cfg.batch_size):
                    batch = indices[start : start + cfg.batch_size]
                    x, y = batch_for_step(task.train_set, batch)
                    stats = accumulate_gradients(net, x.to(device), y.to(device), configs, cfg)
                    for acc, p in zip(numerator, params):
                        acc.add_(p.grad, alpha=len(batch))  # per-sample gradient sum of this batch
                    loss_sum += stats["loss"] * len(batch)
                    samples += len(batch)
                    macs += stats.get("train_macs", 0)
                count = torch.tensor(
                    [float(samples), loss_sum, float(macs)], device=device, dtype=torch.float64
                )
                for t in numerator:
                    dist.all_reduce(t)  # the host stage: sum over this host's workers
                dist.all_reduce(count)
                if spec.rank == 0:
                    for dst, src in zip(grad_buf, numerator):
                        dst.copy_(src.to("cpu"))
                host_samples = int(count[0].item())
                conn.send(
                    (
                        "computed",
                        dict(
                            samples=host_samples,
                            loss=count[1].item() / max(1, host_samples),
                            train_macs=int(count[2].item()),
                            config_hashes=[c.hash for c in configs],
                        ),
                    )
                )
            elif kind == "apply":
                _, round_index, committed = msg
                lr = None
                if committed:
                    for p, g in zip(params, grad_buf):
                        p.grad = g.to(device).clone()
                    lr = optimizer_step(net, optimizer, round_index, cfg)
                    if spec.rank == 0:
                        for dst, src in zip(state_buf, state_tensors(net, optimizer)):
                            dst.copy_(src.detach().to("cpu"))
                dist.barrier()  # the agent may read the state buffer once every worker has applied
                conn.send(("applied", lr))
            else:
                raise ValueError(f"unknown request {kind!r}")
    finally:
        dist.destroy_process_group()


def default_threads(num_workers: int) -> int:
    env = os.environ.get("MANTA_WORKER_THREADS")
    if env and env.isdigit() and int(env) > 0:
        return int(env)
    return max(1, (os.cpu_count() or 1) // max(1, num_workers))
