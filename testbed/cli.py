"""`manta-swarm`: a developer's multi-process local swarm, on 127.0.0.1 or on an emulated internet
(see testbed/local_swarm.py, testbed/wan/)."""

from __future__ import annotations

# Imports of torch, hivemind, pydantic and the modules built on them stay inside the commands, so
# that `--help` and bad input answer at once, before any of them is loaded.
import time
from pathlib import Path

import click

from console.commands import UserError, manta_command
from testbed.wan.rates import RateError, parse_rate


def _rate(ctx, param, value):
    if value is None:
        return None
    try:
        return parse_rate(value)
    except RateError as e:
        raise click.BadParameter(str(e)) from None


LINK_OPTIONS = ("uplink", "downlink", "delay", "jitter", "loss", "nat")


@manta_command("manta-swarm", "Run one aggregator and N peers as separate local processes.")
@click.option("--peers", type=click.IntRange(1, 64), default=None, help="Number of manta-peer processes.")
@click.option(
    "--cohorts", type=click.IntRange(1, 64), default=1, show_default=True, help="Split peers into C cohorts."
)
@click.option("--task", default="digits", show_default=True, help="Built-in task.")
@click.option(
    "--data",
    "data_path",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=None,
    help="Your dataset's folder (tasks imagefolder, cifar10, stereo-folder): the aggregator packs it "
    "into shards the peers fetch from the swarm.",
)
@click.option(
    "--data-layout", default=None, help="stereo-folder: kitti2015, kitti2012, sceneflow or middlebury."
)
@click.option(
    "--shard-samples", type=click.IntRange(1), default=500, show_default=True, help="Samples per shard."
)
@click.option(
    "--whole-dataset",
    is_flag=True,
    help="Every peer trains on every shard (the data-on-every-disk baseline).",
)
@click.option("--mode", type=click.Choice(["data", "model"]), default="data", show_default=True)
@click.option(
    "--rounds", type=click.IntRange(1), default=30, show_default=True, help="Rounds the swarm commits."
)
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
@click.option(
    "--sync",
    type=click.Choice(["every-step", "outer"]),
    default="every-step",
    show_default=True,
    help="How cohorts synchronise: every round's gradient across the swarm, or rare outer steps.",
)
@click.option(
    "--commit",
    type=click.Choice(["board", "certificates"]),
    default="board",
    show_default=True,
    help="What decides a round: a quorum on the commit board, or commit certificates among cohorts.",
)
@click.option(
    "--inner-steps", type=click.IntRange(1), default=5, show_default=True, help="Rounds between outer steps."
)
@click.option("--outer-lr", default="1.0", show_default=True, help="Outer Nesterov learning rate.")
@click.option("--outer-momentum", default="0.0", show_default=True, help="Outer Nesterov momentum.")
@click.option(
    "--outer-compression",
    type=click.Choice(["none", "fp16", "int8", "int4"]),
    default="int8",
    show_default=True,
    help="How pseudo-gradients cross between cohorts (with error feedback).",
)
@click.option(
    "--outer-overlap/--no-outer-overlap",
    default=True,
    show_default=True,
    help="Run each outer exchange during the next inner steps (its step lands one period late).",
)
@click.option(
    "--sites",
    type=click.IntRange(1, 250),
    default=None,
    help="Emulated internet: put the peers into N sites (network namespaces behind shaped links; needs root).",
)
@click.option("--uplink", callback=_rate, help="Each site's uplink rate, as tc writes it (20mbit, 1gbit).")
@click.option("--downlink", callback=_rate, help="Each site's downlink rate.")
@click.option(
    "--delay",
    type=click.FloatRange(0, 10000),
    default=None,
    help="One-way delay between a site and the core, ms.",
)
@click.option(
    "--jitter", type=click.FloatRange(0, 10000), default=None, help="Delay varies by up to +- this many ms."
)
@click.option(
    "--loss",
    type=click.FloatRange(0, 100, max_open=True),
    default=None,
    help="Frames lost each way, percent (0.5 = 0.5 %).",
)
@click.option(
    "--nat", type=click.IntRange(0), default=None, help="Put the last K sites behind NAT (outbound only)."
)
@click.option(
    "--scenario",
    "scenario_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="A TOML file of sites that differ and a churn schedule (see testbed/scenarios/).",
)
@click.option(
    "--churn", default=None, help="Kill peers every:SECONDS or at:T1,T2 (seconds after the first commit)."
)
@click.option(
    "--churn-signal",
    type=click.Choice(["kill", "int"]),
    default="kill",
    show_default=True,
    help="kill: kill -9; int: Ctrl-C (the peer finishes its round and leaves).",
)
@click.option(
    "--churn-replace/--no-churn-replace",
    default=True,
    show_default=True,
    help="Start a new peer for each one stopped.",
)
@click.option(
    "--check-links", is_flag=True, help="Measure every emulated link against its settings, then exit."
)
@click.option(
    "--time-limit",
    type=click.FloatRange(1),
    default=None,
    help="Stop the run after this many seconds (peers finish their round and leave) [default: none].",
)
def main(
    peers,
    cohorts,
    task,
    data_path,
    data_layout,
    shard_samples,
    whole_dataset,
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
    sync,
    commit,
    inner_steps,
    outer_lr,
    outer_momentum,
    outer_compression,
    outer_overlap,
    sites,
    uplink,
    downlink,
    delay,
    jitter,
    loss,
    nat,
    scenario_path,
    churn,
    churn_signal,
    churn_replace,
    check_links,
    time_limit,
) -> None:
    """Start the swarm, show its progress, stop every process, and write the summary."""
    # Options are checked before torch and hivemind are imported, so a typo fails at once.
    from testbed.churn import parse_churn
    from testbed.wan.netns import TestbedError, require_privileges
    from testbed.wan.scenario import LinkProfile, ScenarioError, load_scenario, uniform_scenario, with_churn

    link_values = dict(uplink=uplink, downlink=downlink, delay=delay, jitter=jitter, loss=loss, nat=nat)
    given = [f"--{k}" for k, v in link_values.items() if v is not None]
    try:
        plan = parse_churn(churn, churn_signal, churn_replace) if churn else None
        if scenario_path is not None:
            if sites is not None or given:
                raise UserError(
                    f"--scenario describes the sites; drop {', '.join(['--sites'] * (sites is not None) + given)}"
                )
            scenario = with_churn(load_scenario(scenario_path), plan)
            if peers is not None and peers != scenario.peers:
                raise UserError(
                    f"--peers {peers} differs from the {scenario.peers} peer(s) of {scenario_path}"
                )
            peers = scenario.peers
        elif sites is not None:
            if peers is None and check_links:
                peers = sites  # the check measures links; peers only place the sites
            if peers is None:
                raise UserError("--sites needs --peers")
            link = LinkProfile(uplink, downlink, delay or 0.0, jitter or 0.0, loss or 0.0)
            scenario = uniform_scenario(sites, peers, link, nat or 0, plan, seed)
        else:
            if given:
                raise UserError(
                    f"{', '.join(given)} shape(s) emulated links: add --sites N or --scenario FILE"
                )
            if check_links:
                raise UserError("--check-links measures emulated links: add --sites N or --scenario FILE")
            if peers is None:
                raise UserError("Missing option '--peers'")
            scenario = None
    except ScenarioError as e:
        raise UserError(str(e)) from None
    if scenario is not None:
        try:
            require_privileges()  # before anything slow: one line, at once
        except TestbedError as e:
            raise UserError(str(e)) from None
    if check_links:
        _check_links(scenario, data_dir)
        return
    stereo = task.startswith("stereo")
    target_samples = target_samples or (32 if stereo else 256)
    batch_size = batch_size or (4 if stereo else 32)
    subnets = subnets or (3 if stereo else 4)
    learning_rate = learning_rate or ("0.005" if stereo else "0.1")
    if cohorts > peers:
        raise UserError(f"--cohorts {cohorts} is more than --peers {peers}")
    for name, value in (("--lr", learning_rate), ("--width-mult", width_mult), ("--outer-lr", outer_lr)):
        try:
            if float(value) <= 0:
                raise ValueError
        except ValueError:
            raise UserError(f"{name} must be a positive number, got {value!r}") from None
    if sync == "outer" and rounds % inner_steps:
        raise UserError(
            f"--rounds {rounds} is not a multiple of --inner-steps {inner_steps}: the run would end between "
            "outer steps, each cohort on a state of its own"
        )
    try:
        if not 0 <= float(outer_momentum) < 1:
            raise ValueError
    except ValueError:
        raise UserError(f"--outer-momentum must be in [0, 1), got {outer_momentum!r}") from None
    from protocol.shards import DATA_KINDS
    from protocol.task_spec import BUILTIN_TASKS

    if task not in BUILTIN_TASKS:
        raise UserError(f"unknown task {task!r}; built-in tasks: {', '.join(BUILTIN_TASKS)}")
    if (task in DATA_KINDS) != (data_path is not None):
        raise UserError(
            f"--task {task} needs --data FOLDER"
            if task in DATA_KINDS
            else f"--data is for tasks {', '.join(DATA_KINDS)}"
        )
    run_dir = data_dir or Path(f"manta-run-{time.strftime('%Y%m%d-%H%M%S')}")
    if run_dir.exists() and any(run_dir.iterdir()):
        raise UserError(f"{run_dir} is not empty; choose a new --data-dir")
    from hivemind_adapter.runtime import prepare_process, start_orphan_reaper

    prepare_process()
    start_orphan_reaper()  # if this process is killed, its whole tree goes with it
    from testbed.figures import format_tables
    from testbed.local_swarm import SwarmOptions
    from testbed.runner import RunFailed, run_swarm

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
        sync=sync,
        commit=commit,
        inner_steps=inner_steps,
        outer_lr=outer_lr,
        outer_momentum=outer_momentum,
        outer_compression=outer_compression,
        outer_overlap=outer_overlap,
        until_swarm_round=True,
        data_path=str(data_path) if data_path is not None else "",
        data_layout=data_layout or "",
        shard_samples=shard_samples,
        whole_dataset=whole_dataset,
    )
    click.echo(f"run directory: {run_dir.resolve()}")
    try:
        churn_plan = scenario.churn if scenario is not None else plan  # churn works on loopback too
        summary = run_swarm(options, scenario, churn_plan, click.echo, summary_path, time_limit)
    except (RunFailed, TestbedError) as e:
        raise UserError(str(e)) from None
    from testbed.figures import PeerFigures, SiteFigures
    from testbed.footprint import footprint_line

    peers_fig = [PeerFigures(**p) for p in summary["peers_detail"]]
    sites_fig = [SiteFigures(**s) for s in summary["sites"]] if summary["sites"] is not None else None
    click.echo("")
    click.echo(format_tables(peers_fig, sites_fig, summary["swarm"]))
    quality = summary.get("accuracy") or summary.get("epe") or {}
    click.echo(
        f"{summary['rounds']} rounds, {summary['total_samples']} samples in {summary['wall_time_s']:.0f} s; "
        f"identical final state on every peer that finished: {summary['identical_final_state']}; "
        + ", ".join(f"{k} {v:.4f}" for k, v in quality.items())
    )
    click.echo(footprint_line(summary["footprint"]))
    click.echo(f"summary: {summary_path or run_dir / 'summary.json'}")
    if not summary["rounds"]:
        raise UserError("the swarm committed no round; see the logs under " + str(run_dir))
    if summary["failed_peers"]:
        raise UserError(
            f"peer(s) {', '.join(summary['failed_peers'])} exited with an error; see their log.txt under {run_dir}"
        )


def _check_links(scenario, data_dir: Path | None) -> None:
    import tempfile

    from testbed.wan.linkcheck import check_links, format_rows
    from testbed.wan.netns import TestbedError

    workdir = Path(data_dir) if data_dir else Path(tempfile.mkdtemp(prefix="manta-linkcheck-"))
    try:
        rows = check_links(scenario, workdir, progress=click.echo)
    except TestbedError as e:
        raise UserError(str(e)) from None
    click.echo(format_rows(rows))
    off = [r for r in rows if r.ok is False]
    if off:
        raise UserError(
            f"{len(off)} measurement(s) off their settings: "
            + "; ".join(f"{r.site} {r.quantity}" for r in off)
        )
    click.echo("every emulated link matches its settings")
