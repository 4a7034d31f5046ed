"""``manta-peer check``: the command's options and output (the checks are :mod:`peer.check`)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from console.commands import UserError


@click.command()
@click.option(
    "--initial-peers",
    multiple=True,
    help="Multiaddr of an aggregator or peer (repeatable) [default: the swarm in <data-dir>/swarm.json].",
)
@click.option("--task", "task_id", default=None, help="Task id [default: the only task published].")
@click.option("--aggregator-key", default=None, help="Trust only the task spec signed by this key (hex).")
@click.option("--gpus", default="all", show_default=True, help="all, none, or GPU numbers like 0,2.")
@click.option("--cpu-workers", type=click.IntRange(1, 64), default=1, show_default=True,
              help="CPU worker processes when no GPU is used.")  # fmt: skip
@click.option("--listen", default="0.0.0.0:0", show_default=True, help="HOST:PORT join would listen on.")
@click.option("--announce", multiple=True, help="Public HOST:PORT join would announce (repeatable).")
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("manta-peer"),
    show_default=True,
    help="Where join would keep its files (free disk is measured there; nothing is written).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON object.")
def check(initial_peers, task_id, aggregator_key, gpus, cpu_workers, listen, announce, data_dir, as_json):
    """Check this machine and the swarm before joining: devices, free memory and disk, whether the
    initial peers answer, their task, and whether the swarm can connect to this peer (exit 1 with one
    line if the swarm or its task cannot be reached)."""
    from peer.swarm_record import swarm_to_reach
    from protocol.netaddr import check_listen_options

    # Every check that needs no torch comes first: bad input fails at once.
    try:
        peers, task_id, aggregator_key = swarm_to_reach(initial_peers, task_id, aggregator_key, data_dir)
        check_listen_options(listen, announce)
    except ValueError as e:  # AddressError too
        raise UserError(str(e)) from None
    from hivemind_adapter.runtime import prepare_process

    prepare_process()
    from peer.check import format_check, run_check

    try:
        report = run_check(peers, task_id, aggregator_key, gpus, cpu_workers, listen, announce, data_dir)
    except ValueError as e:  # --gpus naming a GPU that is not there
        raise UserError(str(e)) from None
    click.echo(json.dumps(report, indent=2) if as_json else format_check(report))
    if report["error"]:
        raise UserError(report["error"])
