"""`manta-peer`: the command a volunteer runs."""

from __future__ import annotations

# Imports of torch, hivemind and the modules built on them stay inside the commands: --help and bad
# input answer at once, before seconds of imports (benchmarks/RESULTS.md, "Start-up").
import faulthandler
import json
import logging
import signal
from pathlib import Path

import click

from console.commands import UserError, manta_group
from console.identity_option import identity_option, load_identity

# The node class `join` runs (None: peer.node.PeerNode). Only the test suite's dishonest peers
# (tests/adversaries/) set it, before calling main(); an installed manta-peer never does.
NODE_CLASS = None


@manta_group("manta-peer", "Lend this machine's GPUs or CPU to a MANTA training swarm.")
def main() -> None:
    pass


@main.command()
@identity_option
def identity(identity_path: Path) -> None:
    """Create this machine's identity key if missing; print its public key and fingerprint."""
    existed = identity_path.expanduser().exists()
    ident = load_identity(identity_path, create=True)
    click.echo(f"public key:  {ident.public_key_hex}")
    click.echo(f"fingerprint: {ident.fingerprint}")
    click.echo(f"key file:    {ident.path}{'' if existed else ' (created)'}")


@main.command()
@click.option(
    "--initial-peers", multiple=True, required=True, help="Multiaddr of an aggregator or peer (repeatable)."
)
@click.option("--task", "task_id", default=None, help="Task id to join [default: the only task published].")
@click.option(
    "--aggregator-key", default=None, help="Trust only the task spec signed by this aggregator key (hex)."
)
@click.option("--gpus", default="all", show_default=True, help="all, none, or GPU numbers like 0,2.")
@click.option(
    "--cpu-workers",
    type=click.IntRange(1, 64),
    default=1,
    show_default=True,
    help="CPU worker processes when no GPU is used.",
)
@click.option(
    "--cohort",
    default="auto",
    show_default=True,
    help="Cohort name; auto groups peers by host, then by network.",
)
@click.option("--listen", default="0.0.0.0:0", show_default=True, help="HOST:PORT this peer listens on.")
@click.option("--announce", multiple=True, help="Public HOST:PORT others reach this peer at (repeatable).")
@click.option(
    "--client-mode",
    is_flag=True,
    help="Client mode from the start (join also turns it on when the swarm cannot connect in): reach the "
    "swarm by connecting out; serve only cohort mates on this host or LAN.",
)
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("manta-peer"),
    show_default=True,
    help="Where this peer keeps its files.",
)
@click.option(
    "--cache-size",
    default="10GB",
    show_default=True,
    help="Disk for the task's data shards (e.g. 500MB, 20GB); least recently used ones are evicted.",
)
@click.option(
    "--whole-dataset",
    is_flag=True,
    help="Train on every data shard instead of this peer's share (downloads the whole dataset).",
)
@click.option(
    "--max-rounds", type=click.IntRange(1), default=None, help="Stop after this many committed rounds."
)
@click.option(
    "--until-round",
    type=click.IntRange(1),
    default=None,
    help="Leave once the swarm has committed this many rounds (a joiner stops where the others do).",
)
@click.option(
    "--max-threads",
    type=click.IntRange(1, 1024),
    default=None,
    help="Torch threads per worker [default: the cores shared out among the workers].",
)
@click.option(
    "--cpu-share",
    default="1",
    show_default=True,
    help="Share of the time a worker computes (0.25: it rests three times as long as each mini-batch took).",
)
@click.option(
    "--gpu-memory",
    default=None,
    help="GPU memory a worker may allocate: a size (8GB) or a share of the card (0.5) [default: no cap].",
)
@click.option(
    "--max-upload",
    default=None,
    help="Cap on everything this peer sends, per second (e.g. 2MB, 500KB) [default: no cap].",
)
@click.option(
    "--run-mode",
    type=click.Choice(["always", "when-idle", "not-on-battery"]),
    default="always",
    show_default=True,
    help="When to train: always, only when the machine is idle, or not on battery.",
)
@click.option(
    "--idle-minutes",
    type=click.FloatRange(0, 24 * 60),
    default=5.0,
    show_default=True,
    help="when-idle: minutes without input and with little other load before training starts.",
)
@click.option(
    "--idle-cpu", type=click.FloatRange(0, 100, min_open=True), default=25.0, show_default=True,
    help="when-idle: the machine counts as idle while other processes use less than this % of its CPU.",
)  # fmt: skip
@click.option(
    "--invite", default="", metavar="TOKEN",
    help="The invite token of a task that admits its volunteers by invitation.",
)  # fmt: skip
@identity_option
def join(
    initial_peers,
    task_id,
    aggregator_key,
    gpus,
    cpu_workers,
    cohort,
    listen,
    announce,
    client_mode,
    data_dir,
    cache_size,
    whole_dataset,
    max_rounds,
    until_round,
    max_threads,
    cpu_share,
    gpu_memory,
    max_upload,
    run_mode,
    idle_minutes,
    idle_cpu,
    invite,
    identity_path,
) -> None:
    """Join a swarm and train until stopped (Ctrl-C finishes the round and leaves cleanly;
    `manta-peer pause` and `resume` stop and restart training without leaving)."""
    from peer.shard_cache import parse_size
    from protocol.identity import check_public_key_hex
    from protocol.netaddr import AddressError, check_listen_options, check_peer_multiaddr

    # Every check that needs no torch comes first: bad input fails at once and creates no file.
    try:
        peers = tuple(check_peer_multiaddr(p) for p in initial_peers)
        if aggregator_key is not None:
            aggregator_key = check_public_key_hex(aggregator_key, "--aggregator-key")
        check_listen_options(listen, announce)
    except (AddressError, ValueError) as e:
        raise UserError(str(e)) from None
    try:
        cache_bytes = parse_size(cache_size)
    except ValueError as e:
        raise UserError(f"--cache-size: {e}") from None
    if len(invite) > 256 or not invite.isprintable():
        raise UserError("--invite: a token of at most 256 printable characters")
    if cohort != "auto" and not cohort.replace("-", "").replace("_", "").replace(".", "").isalnum():
        raise UserError(f"--cohort must be letters, digits, '-', '_' or '.', got {cohort!r}")
    limits, upload_rate, run_policy = _machine_limits(
        cpu_share, gpu_memory, max_upload, run_mode, idle_minutes, idle_cpu
    )

    from hivemind_adapter.runtime import prepare_process, start_orphan_reaper

    prepare_process()
    # `kill -USR1` prints where every thread of the agent is, for a peer that seems stuck
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    from hivemind_adapter.averager_process import AveragerGone, AveragerStartFailed
    from peer.devices import discover_devices
    from peer.node import PeerNode
    from peer.startup import JoinConfig, PeerStartError
    from peer.stopping import StopSignals, SwarmLost
    from peer.worker_fork import WaitingWorkers
    from peer.worker_pool import WorkerDied

    log = logging.getLogger("manta.peer")
    try:
        devices = discover_devices(gpus, cpu_workers)
    except ValueError as e:
        raise UserError(str(e)) from None
    ident = load_identity(identity_path, create=True)
    start_orphan_reaper()
    config = JoinConfig(
        peers,
        task_id,
        aggregator_key,
        cohort,
        listen,
        tuple(announce),
        client_mode,
        data_dir,
        max_rounds,
        until_round,
        cache_bytes=cache_bytes,
        whole_dataset=whole_dataset,
        threads=max_threads,
        limits=limits,
        run_policy=run_policy,
        invite=invite,
    )
    if upload_rate is not None:
        from hivemind_adapter.upload_limit import limit_upload

        limit_upload(upload_rate)  # before the node forks its processes: they share the cap
    # the workers' processes, forked before the agent's first thread and its signal handlers
    waiting = WaitingWorkers.fork_for(devices)
    signals = StopSignals()
    signals.install()  # Ctrl-C during start-up stops what was built, too
    node = None
    try:
        try:
            node = (NODE_CLASS or PeerNode).start(config, ident, devices, signals, waiting)
        except PeerStartError as e:
            raise UserError(str(e)) from None
        _remember_swarm(data_dir, peers, node)
        log.info(f"training on {len(devices)} worker(s): {', '.join(d.torch_device for d in devices)}")
        reports = node.run()
        committed = sum(r.committed for r in reports)
        saved = node.save_state()
        click.echo(
            f"left after {len(reports)} round(s), {committed} committed; final state "
            f"{node.state_digest[:12]} (round {node.state_round}) saved to {saved}"
        )
    except (SwarmLost, AveragerStartFailed, AveragerGone) as e:
        raise UserError(signals.lost or str(e)) from None  # an averager waits in vain on a lost DHT
    except KeyboardInterrupt:
        log.info("round abandoned")
    except WorkerDied as e:
        raise UserError(f"{e}; the worker's error is in the log above") from None
    finally:
        if node is not None:
            node.shutdown()
        if waiting is not None:
            waiting.close()


def _machine_limits(cpu_share, gpu_memory, max_upload, run_mode, idle_minutes, idle_cpu):
    """The join options that lend the machine, checked: (worker limits, upload bytes/s or None, run
    policy). Raises UserError with one line."""
    from peer.run_policy import RunPolicy
    from peer.shard_cache import parse_size
    from peer.worker import WorkerLimits

    try:
        share = float(cpu_share)
    except ValueError:
        share = -1.0
    if not 0.01 <= share <= 1.0:
        raise UserError(f"--cpu-share must be a number from 0.01 to 1, got {cpu_share!r}")
    fraction = memory = None
    if gpu_memory is not None:
        try:
            fraction = float(gpu_memory)
            if not 0 < fraction <= 1:
                raise UserError(f"--gpu-memory as a share must be in (0, 1], got {gpu_memory!r}")
        except ValueError:
            try:
                memory = parse_size(gpu_memory)
            except ValueError as e:
                raise UserError(f"--gpu-memory: {e}") from None
    upload = None
    if max_upload is not None:
        try:
            upload = parse_size(max_upload)
        except ValueError as e:
            raise UserError(f"--max-upload: {e}") from None
        if upload < 16 * 1024:
            raise UserError(f"--max-upload must be at least 16KB per second, got {max_upload!r}")
    policy = RunPolicy(run_mode, idle_minutes, idle_cpu)
    return WorkerLimits(share, fraction, memory), upload, policy


def _remember_swarm(data_dir: Path, peers: tuple[str, ...], node) -> None:
    """Write ``<data-dir>/swarm.json`` for ``manta-peer credits`` (a failure is a warning, not the end)."""
    from peer.swarm_record import SwarmRecord, write_swarm_record

    record = SwarmRecord(peers, node.spec.record.task_id, node.spec.public_key.hex())
    try:
        write_swarm_record(data_dir, record)
    except OSError as e:
        logging.getLogger("manta.peer").warning(f"could not write {data_dir}/swarm.json: {e}")


@main.command()
@click.option(
    "--initial-peers",
    multiple=True,
    help="Multiaddr of an aggregator or peer (repeatable) [default: the swarm in <data-dir>/swarm.json].",
)
@click.option(
    "--task", "task_id", default=None, help="Task id [default: swarm.json's, else the only task published]."
)
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("manta-peer"),
    show_default=True,
    help="The peer's data directory (its swarm.json and receipt outbox).",
)
@click.option(
    "--json", "as_json", is_flag=True, help="Print every figure as JSON (credits in FLOPs and GPU-hours)."
)
@identity_option
def credits(initial_peers, task_id, data_dir, as_json, identity_path) -> None:
    """Print this key's credits from the aggregator's ledger and check every inclusion proof."""
    from peer.swarm_record import swarm_to_reach

    # Every check that needs no torch comes first: bad input fails at once and creates no file.
    try:
        peers, task_id, aggregator_key = swarm_to_reach(initial_peers, task_id, None, data_dir)
    except ValueError as e:  # AddressError too
        raise UserError(str(e)) from None
    ident = load_identity(identity_path, create=False)
    from hivemind_adapter.runtime import prepare_process

    prepare_process()
    from peer.credits import CreditsError, credits_json, fetch_credits, format_credits

    try:
        report = fetch_credits(peers, task_id, ident, data_dir, aggregator_key)
    except CreditsError as e:
        raise UserError(str(e)) from None
    click.echo(json.dumps(credits_json(report), indent=2) if as_json else format_credits(report))
    if report["bad_proofs"]:
        raise UserError(f"{report['bad_proofs']} inclusion proof(s) do not check against the checkpoint")


def _control_command(name: str, command: str, summary: str):
    @main.command(name=name, help=summary)
    @click.option(
        "--data-dir", type=click.Path(file_okay=False, path_type=Path), default=Path("manta-peer"),
        show_default=True, help="The data directory of the running peer.",
    )  # fmt: skip
    @click.option("--json", "as_json", is_flag=True, help="Print the peer's status as JSON.")
    def run(data_dir: Path, as_json: bool) -> None:
        from peer.control import ControlError, request

        try:
            status = request(data_dir, command)
        except ControlError as e:
            raise UserError(str(e)) from None
        click.echo(json.dumps(status, indent=2) if as_json else _describe(status, command))

    return run


def _describe(status: dict, command: str) -> str:
    """The running peer's status in a few lines for a person."""
    state = status.get("state", "?")
    if command == "pause" and state == "running":
        state = "pausing after this round"
    if command == "resume" and state == "paused" and not status.get("reason", "").startswith("paused by"):
        state = f"resuming once it may: {status.get('reason')}"
    lines = [f"peer {str(status.get('peer_id', '?'))[-8:]} in task {status.get('task_id', '?')}: {state}"]
    if status.get("state") == "paused" and status.get("reason"):
        lines.append(f"  why: {status['reason']}")
    if "round" in status:
        lines.append(
            f"  state of round {status['round']} ({status.get('state_digest', '')}), "
            f"{status.get('committed_rounds', 0)} round(s) committed here, {status.get('roster', 0)} peer(s) online"
        )
    last = status.get("last_round")
    if last:
        outcome = "committed" if last.get("committed") else f"aborted ({last.get('reason', '')})"
        lines.append(f"  last round {last.get('round')}: {outcome}, {last.get('samples')} samples")
    lines.append(f"  run mode: {status.get('run_mode', 'always')}")
    return "\n".join(lines)


status = _control_command("status", "status", "Show what the peer running in --data-dir is doing.")
pause = _control_command(
    "pause", "pause", "Pause the running peer after its round: it leaves its cohort and waits."
)
resume = _control_command("resume", "resume", "Resume a paused peer: it rejoins the swarm with the same key.")


from peer.check_cli import check  # noqa: E402  (a command of this group; its own module)

main.add_command(check)
