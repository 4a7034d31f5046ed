"""`manta-aggregator`: the command a bootstrap/aggregator operator runs."""

from __future__ import annotations

# Imports of torch, hivemind and the modules built on them stay inside the commands: --help and bad
# input answer at once, before seconds of imports (benchmarks/RESULTS.md, "Start-up").
import dataclasses
import logging
import sys
from pathlib import Path

import click

from console.commands import UserError, manta_group
from console.identity_option import identity_option, identity_to_create, keep_identity
from protocol.identity import IdentityError
from protocol.netaddr import AddressError, check_peer_multiaddr, host_port_to_multiaddr

logger = logging.getLogger("manta.aggregator")


@manta_group(
    "manta-aggregator", "Run a MANTA bootstrap aggregator: seed the swarm, publish the task, keep the books."
)
def main() -> None:
    pass


@main.command()
@click.option(
    "--task",
    "task_ref",
    default=None,
    help="Built-in task name (e.g. digits) or a task .toml file (not needed with --resume).",
)
@click.option(
    "--listen", default="0.0.0.0:31337", show_default=True, help="HOST:PORT the DHT node listens on."
)
@click.option(
    "--announce",
    multiple=True,
    help="Public HOST:PORT to advertise (repeatable), e.g. behind port forwarding.",
)
@click.option(
    "--initial-peers", multiple=True, help="Multiaddr of another aggregator or peer to join (repeatable)."
)
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where this aggregator keeps its files [default: ./manta-aggregator-<task id>].",
)
@click.option(
    "--refresh",
    type=click.FloatRange(1.0, 3600.0),
    default=30.0,
    show_default=True,
    help="Seconds between re-publications of the task record.",
)
@click.option(
    "--checkpoint-every",
    type=click.FloatRange(0.0, 86400.0),
    default=30.0,
    show_default=True,
    help="Seconds between checkpoints of the swarm's state (0: none).",
)
@click.option("--keep-checkpoints", type=click.IntRange(1), default=5, show_default=True)
@click.option("--resume", is_flag=True, help="Continue the run in --data-dir from its newest checkpoint.")
@click.option(
    "--audit-fraction",
    type=click.FloatRange(0.0, 1.0),
    default=0.1,
    show_default=True,
    help="Share of accepted receipts whose gradient a spot audit recomputes.",
)
@click.option(
    "--http",
    "http",
    default=None,
    metavar="HOST:PORT|off",
    help="Where the web dashboard, JSON API and /metrics listen; 'off' for none "
    "[default: 127.0.0.1:8080, or a free port if that one is taken].",
)
@click.option(
    "--tensorboard",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    metavar="DIR",
    help="Also write each round's loss, accuracy, throughput, peers and wide-area bytes as TensorBoard "
    "scalars to DIR (needs the tensorboard package).",
)
@identity_option
def start(
    task_ref,
    listen,
    announce,
    initial_peers,
    data_dir,
    refresh,
    checkpoint_every,
    keep_checkpoints,
    resume,
    audit_fraction,
    http,
    tensorboard,
    identity_path,
) -> None:
    """Start the bootstrap node, publish the task and print the line volunteers run."""
    from aggregator.monitor.tensorboard import TensorBoardError, check_available

    if tensorboard is not None:
        try:
            check_available()
        except TensorBoardError as e:
            raise UserError(str(e)) from None
    from aggregator.membership_policy import membership_policy, save_policy, saved_policy
    from aggregator.monitor.server import DashboardError, parse_dashboard_option
    from aggregator.task_publication import TaskFileError, read_task_document, saved_task_spec

    # Every check that needs no torch comes first, and the identity key is written only once the
    # task is built: bad input fails at once and leaves no file behind.
    if task_ref is None and not resume:
        raise UserError("--task is required (or --resume with the --data-dir of an earlier run)")
    if resume and data_dir is None:
        raise UserError("--resume needs the --data-dir of the run to continue")
    try:
        spec = saved_task_spec(data_dir, task_ref) if resume else None
        if task_ref is not None:
            document = read_task_document(task_ref)
            policy = membership_policy(document.get("membership"), Path(task_ref).parent)
        else:
            policy = saved_policy(data_dir)
        host_port_to_multiaddr(listen, "--listen")
        for a in announce:
            host_port_to_multiaddr(a, "--announce", allow_port_zero=False)
        peers = tuple(check_peer_multiaddr(p) for p in initial_peers)
        dashboard, dashboard_fallback = parse_dashboard_option(http)
    except (TaskFileError, AddressError, DashboardError) as e:
        raise UserError(str(e)) from None
    identity = identity_to_create(identity_path)
    from hivemind_adapter.runtime import prepare_process, start_orphan_reaper

    prepare_process()
    from aggregator.bootstrap import BootstrapAggregator, BootstrapConfig, ProcessLost
    from aggregator.contributions import LedgerBehind
    from aggregator.join_line import join_command
    from aggregator.task_data import pack_into
    from aggregator.task_publication import build_task_spec
    from supernet.checkpoint import CheckpointError

    if spec is None:
        chosen_dir = data_dir
        pack = pack_into(lambda task_id: chosen_dir or Path(f"manta-aggregator-{task_id}"))
        try:
            spec = build_task_spec(task_ref, identity, pack_data=pack)
        except TaskFileError as e:
            raise UserError(str(e)) from None
    identity = keep_identity(identity, identity_path)
    data_dir = data_dir or Path(f"manta-aggregator-{spec.task_id}")
    start_orphan_reaper()
    config = BootstrapConfig(
        listen, tuple(announce), peers, data_dir, refresh, checkpoint_every, keep_checkpoints, resume
    )
    config = dataclasses.replace(
        config, dashboard=dashboard, dashboard_fallback=dashboard_fallback, audit_fraction=audit_fraction
    )
    config = dataclasses.replace(config, tensorboard=tensorboard, membership=policy)
    save_policy(policy, data_dir)
    node = BootstrapAggregator(spec, identity, config)
    try:
        try:
            maddrs = node.start()
        except (
            CheckpointError,
            DashboardError,
            IdentityError,
            LedgerBehind,
            TaskFileError,
            TensorBoardError,
        ) as e:
            raise UserError(str(e)) from None
        except Exception as e:  # hivemind reports an unusable port or unreachable peers in many ways
            raise UserError(
                f"could not start the DHT node: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
            ) from None
        logger.info(
            f"aggregator {identity.fingerprint} serving task {spec.task_id} ({spec.task}, {spec.mode}-parallel); data in {data_dir}"
        )
        if node.monitor is not None and node.monitor.url:
            click.echo(f"Dashboard: {node.monitor.url}")
        click.echo("Volunteers join with:")
        click.echo(
            f"  {join_command(node.published.record.task_id, maddrs, node.published.public_key.hex())}"
        )
        sys.stdout.flush()
        try:
            node.serve_forever()
        except ProcessLost as e:
            raise UserError(str(e)) from None
        logger.info("stopping")
    finally:
        node.shutdown()


from aggregator.search_cli import search  # noqa: E402  (a command of this group; its own module)

main.add_command(search)
