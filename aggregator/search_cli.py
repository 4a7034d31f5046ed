"""``manta-aggregator search``: the sub-network search of ``manta-search``, with the online peers
evaluating shares of every generation (see :mod:`aggregator.search_dispatch`).

    manta-aggregator search --data-dir AGG_DIR [--initial-peers MULTIADDR] (--max-mflops Y | ...)
                            [--checkpoint PATH] [--peers-wait S] [--peer-timeout S] [--verify-fraction F]
                            [manta-search options]

It uses the aggregator's task (``AGG_DIR/task.sealed``), its identity (``--identity``, which must be
one of the task's aggregator keys: peers serve only requests signed by one) and its newest
checkpoint (``AGG_DIR/checkpoints/round-*.pt``) unless ``--checkpoint`` names another. The result is
the one ``manta-search`` gives on the same checkpoint with the same options, whatever the number of
peers; ``--json`` adds a ``distributed`` section (the checkpoint, each peer's count of evaluated and
locally redone configs and of its spot checks, and every evaluated config's value).

Spot checks (``--verify-fraction``, :class:`supernet.search.distributed.SpotChecks`): about that
fraction of each peer's share, and at least one config of it, is evaluated here too and compared
exactly with the peer's values; a peer with one wrong value has its share redone here and gets no
further share in this search. Which configs are checked follows an HMAC key drawn at random for each
search and never sent, so a peer cannot tell which of its values will be checked.
"""

from __future__ import annotations

# Imports of torch, hivemind and the modules built on them stay inside the commands, so that `--help`
# and bad input answer at once, before any of them is loaded (they take seconds).
import shutil
import tempfile
from pathlib import Path
from typing import Any

import click

from console.commands import UserError
from console.identity_option import identity_option, load_identity

_DIR = click.Path(file_okay=False, path_type=Path)
_FILE = click.Path(dir_okay=False, path_type=Path)


def newest_checkpoint(data_dir: Path) -> Path:
    found = sorted((data_dir / "checkpoints").glob("round-*.pt"))
    if not found:
        raise UserError(f"{data_dir}: no checkpoint yet in {data_dir / 'checkpoints'} (or give --checkpoint)")
    return found[-1]


def _recorded_multiaddrs(data_dir: Path) -> tuple[str, ...]:
    """Where the aggregator of ``data_dir`` listens, as ``manta-aggregator start`` recorded it."""
    from aggregator.join_line import MULTIADDRS_FILE

    path = data_dir / MULTIADDRS_FILE
    found = (
        tuple(line.strip() for line in path.read_text().splitlines() if line.strip())
        if path.is_file()
        else ()
    )
    if not found:
        raise UserError(
            f"{data_dir}: no {MULTIADDRS_FILE} (the aggregator has not started there): give --initial-peers, "
            "or --peers-wait 0 to search locally"
        )
    return found


def _search_command(fn):
    from supernet.search.options import search_options

    return search_options(fn)


@click.command("search")
@click.option(
    "--data-dir", required=True, type=_DIR, help="The aggregator's data directory (task, checkpoints)."
)
@click.option("--checkpoint", type=_FILE, default=None, help="Search this checkpoint [default: the newest].")
@click.option("--initial-peers", multiple=True,
              help="Multiaddr of the aggregator or a peer (repeatable) [default: AGG_DIR/multiaddrs.txt].")  # fmt: skip
@click.option("--peers-wait", type=click.FloatRange(0.0, 3600.0), default=10.0, show_default=True,
              help="Seconds to wait for online peers (0: search locally).")  # fmt: skip
@click.option("--peer-timeout", type=click.FloatRange(1.0, 86400.0), default=300.0, show_default=True,
              help="Seconds a peer may take for one share (its first includes the checkpoint download); "
              "a slower share is evaluated locally.")  # fmt: skip
@click.option("--verify-fraction", type=click.FloatRange(0.0, 1.0), default=0.1, show_default=True,
              help="Fraction of each peer's share (at least one config) re-evaluated here and compared "
              "exactly; a peer with a wrong value gets no further shares (0: no checks).")  # fmt: skip
@identity_option
@_search_command
def search(
    data_dir: Path,
    checkpoint: Path | None,
    initial_peers: tuple[str, ...],
    peers_wait: float,
    peer_timeout: float,
    verify_fraction: float,
    identity_path: Path,
    json_path: Path | None,
    **given: Any,
) -> None:
    """Search sub-networks of the aggregator's checkpoint, spreading evaluations over online peers."""
    from protocol.netaddr import AddressError, check_peer_multiaddr
    from protocol.sealing import RecordRejected, open_sealed
    from protocol.task_spec import TaskSpec
    from supernet.search.options import SearchInputError, check_option_values

    # Every check that needs no torch comes first: bad input fails at once.
    sealed_path = data_dir / "task.sealed"
    if not sealed_path.is_file():
        raise UserError(
            f"{data_dir}: not an aggregator data directory (no task.sealed; run manta-aggregator start)"
        )
    try:
        spec = open_sealed(sealed_path.read_bytes(), TaskSpec).record
    except RecordRejected as e:
        raise UserError(f"{sealed_path}: {e}") from None
    identity = load_identity(identity_path, create=False)
    if identity.public_key_hex not in spec.aggregator_keys:
        raise UserError(
            f"{identity_path}: key {identity.fingerprint} is not an aggregator key of task {spec.task_id} "
            "(peers serve only requests signed by one)"
        )
    if not initial_peers and peers_wait > 0:
        initial_peers = _recorded_multiaddrs(data_dir)
    try:
        peers = tuple(check_peer_multiaddr(p) for p in initial_peers)
    except AddressError as e:
        raise UserError(str(e)) from None
    source = checkpoint or newest_checkpoint(data_dir)
    if not source.is_file():
        raise UserError(f"checkpoint {source} does not exist")
    try:
        check_option_values(
            given["max_latency_ms"], given["max_mflops"], given["export_path"], given["estimator"]
        )
    except SearchInputError as e:
        raise UserError(str(e)) from None
    from hivemind_adapter.runtime import prepare_process

    prepare_process()
    from supernet.search.report import options_from, progress, write_json

    data = given["data"] or (data_dir / "data" if spec.data is not None else None)
    options = options_from(source, {**given, "task": given["task"] or spec.task, "data": data})
    say = progress()
    with tempfile.TemporaryDirectory(prefix="manta-search-") as scratch:
        # A private copy: the aggregator deletes old checkpoints while the search runs.
        copy = Path(scratch) / source.name
        try:
            shutil.copyfile(source, copy)
        except OSError as e:
            raise UserError(f"{source}: {e.strerror or e}") from None
        options.checkpoint = copy
        report, extra = _run(
            options,
            spec.task_id,
            identity,
            peers,
            peers_wait,
            peer_timeout,
            verify_fraction,
            say,
            frozenset(spec.aggregator_keys),
        )
    extra["checkpoint"] = str(source)
    _print(report, extra)
    if json_path is not None:
        from supernet.search.run import summary

        write_json(json_path, {**summary(report), "distributed": extra})


def _run(
    options, task_id, identity, initial_peers, peers_wait, peer_timeout, verify_fraction, say, aggregator_keys
):
    from concurrent.futures import ThreadPoolExecutor

    from aggregator.search_dispatch import (
        CheckpointServer,
        RemotePeer,
        SearchLink,
        progress_map,
        wait_for_peers,
    )
    from hivemind_adapter.dht import SwarmUnreachable, start_dht
    from hivemind_adapter.p2p import Endpoint
    from supernet.checkpoint import CheckpointError
    from supernet.search.accuracy import DirectEvaluator
    from supernet.search.distributed import SpotChecks, evaluator_arguments
    from supernet.search.report import search_or_fail
    from supernet.search.run import SearchInputError, load_search_checkpoint

    try:  # what every peer must reproduce: the checkpoint and the evaluator built from these options
        loaded = load_search_checkpoint(options)
    except (CheckpointError, SearchInputError) as e:
        raise UserError(str(e)) from None
    local = DirectEvaluator(
        loaded.workload, loaded.net, val_samples=options.val_samples, bn_batches=options.bn_batches,
        seed=options.seed,
    )  # fmt: skip
    arguments = evaluator_arguments(local, options.seed)
    settings = {**local.settings, "checkpoint": loaded.digest}
    digest, round_index = loaded.digest, loaded.round
    del loaded, local

    checks = SpotChecks(verify_fraction)  # its key: random, this process's secret
    dht = endpoint = server = pool = None
    helpers: list[RemotePeer] = []
    try:
        if peers_wait > 0:
            from hivemind_adapter.runtime import start_orphan_reaper

            start_orphan_reaper()  # if this process is killed, its DHT node and p2pd die with it

            try:
                dht = start_dht(initial_peers=initial_peers, client_mode=True)
            except SwarmUnreachable as e:
                raise UserError(f"cannot reach the swarm: {e}") from None
            endpoint = Endpoint(dht, "manta-search")
            server = CheckpointServer(endpoint, task_id, options.checkpoint)
            link = SearchLink(
                endpoint, identity, task_id,
                {"sha256": server.sha256, "size": len(server.data), "digest": digest, "round": round_index},
                arguments, settings,
            )  # fmt: skip
            say(f"waiting up to {peers_wait:g} s for online peers of task {task_id}")
            helpers = [
                RemotePeer(link, p, peer_timeout)
                for p in wait_for_peers(dht, task_id, peers_wait, aggregator_keys)
            ]
        if helpers:
            say(f"{len(helpers)} peer(s) online: {', '.join(h.name for h in helpers)}; each evaluates a share "
                "of every generation (a failed share is redone here)")  # fmt: skip
            if verify_fraction > 0:
                say(f"spot checks: {verify_fraction:g} of each share (at least one config) is evaluated "
                    "here too; a peer with a wrong value gets no further shares")  # fmt: skip
            pool = ThreadPoolExecutor(len(helpers), thread_name_prefix="manta-share")
            map_fn = progress_map(helpers, pool, say, checks)
            report = search_or_fail(options, say, helpers=helpers, map_fn=map_fn, checks=checks)
        else:
            say("no peer online: evaluating every sub-network locally")
            report = search_or_fail(options, say)
    finally:
        if pool is not None:
            pool.shutdown(wait=True)
        if server is not None:
            server.close()
        if endpoint is not None:
            endpoint.close()
        if dht is not None:
            dht.shutdown()
    extra = {
        "peers": [
            {"peer_id": h.peer_id, "configs": h.configs, "redone_locally": h.redone, **checks.of(i)}
            for i, h in enumerate(helpers)
        ],
        "verify_fraction": verify_fraction,
        "evaluated": {c.hash: c.metric for s in report.searches for c in s.candidates},
        "pages_served": server.pages if server is not None else 0,
    }
    return report, extra


def _print(report, extra: dict) -> None:
    from supernet.search.report import render

    click.echo(render(report))
    if not extra["peers"]:
        click.echo("evaluated locally (no peer online)")
    for p in extra["peers"]:
        click.echo(
            f"peer {p['peer_id']}: {p['configs']} sub-network(s) evaluated"
            + (f", {p['redone_locally']} redone locally after a failure" if p["redone_locally"] else "")
            + (f", {p['verified']} spot-checked" if p["verified"] else "")
            + (
                f", {p['mismatches']} wrong value(s): {p['discarded']} discarded and redone locally, untrusted"
                if p["untrusted"]
                else ""
            )
        )
