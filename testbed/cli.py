"""`manta-swarm`: a developer's multi-process local swarm on 127.0.0.1 (see peer/local_swarm.py)."""

from __future__ import annotations

import time
from pathlib import Path

import click

from protocol.cli_support import UserError, manta_command


@manta_command("manta-swarm", "Run one aggregator and N peers as separate local processes on 127.0.0.1.")
@click.option("--peers", type=click.IntRange(1, 64), required=True, help="Number of manta-peer processes.")
@click.option(
    "--cohorts", type=click.IntRange(1, 64), default=1, show_default=True, help="Split peers into C cohorts."
)
@click.option("--task", default="digits", show_default=True, help="Built-in task.")
@click.option("--mode", type=click.Choice(["data", "model"]), default="data", show_default=True)
@click.option("--rounds", type=click.IntRange(1), default=30, show_default=True, help="Committed rounds.")
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where every process keeps its files [default: a new ./manta-run-<time> folder].",
)
@click.option(
    "--summary",
    "summary_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write the summary JSON here [default: <data-dir>/summary.json].",
)
@click.option(
    "--target-samples",
    type=click.IntRange(1),
    default=None,
    help="Samples the swarm processes per round [default: 256; stereo 32].",
)
@click.option(
    "--batch-size", type=click.IntRange(2), default=None, help="Mini-batch size [default: 32; stereo 4]."
)
@click.option(
    "--subnets",
    type=click.IntRange(1, 64),
    default=None,
    help="K sub-networks per round [default: 4; stereo 3].",
)
@click.option(
    "--lr", "learning_rate", default=None, help="Learning rate [default: 0.1 (SGD); stereo 0.005 (AdamW)]."
)
@click.option("--width-mult", default="0.5", show_default=True, help="Supernet width (classification).")
@click.option("--seed", type=int, default=0, show_default=True)
def main(
    peers,
    cohorts,
    task,
    mode,
    rounds,
    data_dir,
    summary_path,
    target_samples,
    batch_size,
    subnets,
    learning_rate,
    width_mult,
    seed,
) -> None:
    """Start the swarm, show its progress, stop every process, and write the summary."""
    from peer.local_swarm import LocalSwarm, SwarmOptions
    from peer.swarm_summary import progress_line, summarise, write_summary
    from protocol.runtime import prepare_process, start_orphan_reaper
    from tasks import available_tasks

    if task not in available_tasks():
        raise UserError(f"unknown task {task!r}; built-in tasks: {', '.join(available_tasks())}")
    stereo = task.startswith("stereo")
    target_samples = target_samples or (32 if stereo else 256)
    batch_size = batch_size or (4 if stereo else 32)
    subnets = subnets or (3 if stereo else 4)
    learning_rate = learning_rate or ("0.005" if stereo else "0.1")
    if cohorts > peers:
        raise UserError(f"--cohorts {cohorts} is more than --peers {peers}")
    for name, value in (("--lr", learning_rate), ("--width-mult", width_mult)):
        try:
            if float(value) <= 0:
                raise ValueError
        except ValueError:
            raise UserError(f"{name} must be a positive number, got {value!r}") from None
    prepare_process()
    start_orphan_reaper()  # if this process is killed, its whole tree goes with it
    run_dir = data_dir or Path(f"manta-run-{time.strftime('%Y%m%d-%H%M%S')}")
    if run_dir.exists() and any(run_dir.iterdir()):
        raise UserError(f"{run_dir} is not empty; choose a new --data-dir")
    options = SwarmOptions(
        peers=peers,
        cohorts=cohorts,
        task=task,
        mode=mode,
        rounds=rounds,
        run_dir=run_dir,
        target_samples=target_samples,
        batch_size=batch_size,
        subnets=subnets,
        learning_rate=learning_rate,
        width_mult=width_mult,
        seed=seed,
    )
    swarm = LocalSwarm(options)
    click.echo(f"run directory: {run_dir.resolve()}")
    started = time.monotonic()
    try:
        try:
            swarm.start_aggregator()
        except RuntimeError as e:
            raise UserError(str(e)) from None
        click.echo(f"aggregator up; starting {peers} peer(s) ({mode}-parallel, {cohorts} cohort(s), {task})")
        for i in range(peers):
            swarm.start_peer(i)
        shown = -1
        while swarm.peers_running():
            time.sleep(1.0)
            line = progress_line(swarm, peers, rounds)
            if line is not None and line[0] > shown:
                shown = line[0]
                click.echo(f"[{time.monotonic() - started:6.0f}s] {line[1]}")
        failed = [n for n in swarm.peer_names() if swarm.procs[n].returncode != 0]
        if failed:
            click.echo(f"peer(s) {', '.join(failed)} exited with an error; see their log.txt", err=True)
    except KeyboardInterrupt:
        click.echo("stopping: peers finish their round and leave (Ctrl-C again to kill)")
        try:
            swarm.stop()
        except KeyboardInterrupt:
            swarm.stop(grace=0.0)
    finally:
        swarm.close()
    wall = time.monotonic() - started
    click.echo("all processes stopped; evaluating the final state")
    summary = summarise(swarm, peers, wall)
    path = summary_path or run_dir / "summary.json"
    write_summary(summary, path)
    quality = summary.get("accuracy") or summary.get("epe") or {}
    click.echo(
        f"{summary['rounds']} rounds, {summary['total_samples']} samples in {summary['wall_time_s']:.0f} s; "
        f"identical final state on every peer: {summary['identical_final_state']}; "
        + ", ".join(f"{k} {v:.4f}" for k, v in quality.items())
    )
    click.echo(f"summary: {path}")
    if not summary["rounds"]:
        raise UserError("the swarm committed no round; see the logs under " + str(run_dir))
