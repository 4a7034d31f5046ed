"""``manta-peer check``: a preflight that trains nothing and creates no file. It reports this
machine's devices, free memory and free disk, whether the initial peers answer, the task they
publish, and whether the swarm can reach this peer (a dial-back, :mod:`peer.reachability`).

:func:`run_check` returns one JSON-able report; ``report["error"]`` is one line when the swarm or its
task cannot be reached (the command then exits non-zero). Every step is bounded.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

import psutil

from hivemind_adapter.dht import SwarmUnreachable, start_dht
from hivemind_adapter.p2p import Endpoint
from peer.devices import discover_devices
from peer.reachability import Reachability, describe, initial_peer_ids, probe
from peer.swarm_view import fetch_task
from protocol.identity import fingerprint
from protocol.netaddr import host_port_to_multiaddr

TASK_SECONDS = 20.0  # for the task's record to arrive


def _disk(data_dir: Path) -> dict:
    """Free space where ``data_dir`` is, or would be made (its nearest existing parent)."""
    path = data_dir.expanduser().absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    usage = shutil.disk_usage(path)
    return {"path": str(data_dir), "free_bytes": usage.free, "total_bytes": usage.total}


def _machine(gpus: str, cpu_workers: int, data_dir: Path) -> dict:
    devices = discover_devices(gpus, cpu_workers)  # ValueError for --gpus naming absent GPUs
    memory = psutil.virtual_memory()
    return {
        "devices": [
            {"kind": d.kind, "index": d.index, "name": d.name, "memory_mb": d.memory_mb} for d in devices
        ],
        "memory": {"available_bytes": memory.available, "total_bytes": memory.total},
        "disk": _disk(data_dir),
    }


def run_check(
    initial_peers: Sequence[str],
    task_id: str | None,
    aggregator_key: str | None,
    gpus: str,
    cpu_workers: int,
    listen: str,
    announce: Sequence[str],
    data_dir: Path,
) -> dict:
    """The report (see the module docstring). Raises ValueError for a ``gpus`` that is not there."""
    report = _machine(gpus, cpu_workers, data_dir)
    report.update(initial_peers=[], task=None, reachability=None, error=None, listen=listen)
    try:  # a client-mode node that still listens: it can be dialled back without joining the DHT as a server
        dht = start_dht(
            initial_peers=initial_peers,
            host_maddrs=[host_port_to_multiaddr(listen, "--listen")],
            announce_maddrs=[host_port_to_multiaddr(a, "--announce") for a in announce] or None,
            client_mode=True,
        )
    except SwarmUnreachable as e:
        report["error"] = f"cannot reach the swarm: {e}"
        report["initial_peers"] = [
            {"peer_id": p, "answered": False, "at": []} for p in initial_peer_ids(initial_peers)
        ]
        return report
    try:
        endpoint = Endpoint(dht, "manta-check")
        try:
            for peer_id in initial_peer_ids(initial_peers):
                at = endpoint.loop.run(endpoint.connections_of(peer_id), timeout=10)
                report["initial_peers"].append({"peer_id": peer_id, "answered": bool(at), "at": at})
            try:
                spec = fetch_task(dht, task_id, aggregator_key, wait=TASK_SECONDS)
                task = spec.record
                report["task"] = {
                    "task_id": task.task_id, "task": task.task, "mode": task.mode,
                    "aggregator": fingerprint(spec.public_key), "aggregator_key": spec.public_key.hex(),
                }  # fmt: skip
            except LookupError as e:
                report["error"] = str(e)
            reach = probe(dht, endpoint, initial_peers)
            summary = _summary(reach, listen, bool(announce))
            report["reachability"] = {**reach.as_json(), "summary": summary}
        finally:
            endpoint.close()
    finally:
        dht.shutdown()
    return report


def _gb(n: int) -> str:
    return f"{n / 1e9:.1f} GB"


def _summary(reach: Reachability, listen: str, announced: bool) -> str:
    """What :func:`describe` says, as what ``join`` would do with these options."""
    line = describe(reach, listen)
    if reach.verdict == "unreachable":
        if announced:
            return (
                line.split(" it runs in client mode")[0].rstrip(":;")
                + "; check the forwarding behind --announce"
            )
        return line.replace("it runs in client mode", "join would run in client mode", 1)
    if reach.verdict == "reachable":
        return line + "; join runs as a server"
    return line + "; join runs as a server, as before (pass --client-mode if this machine is behind NAT)"


def format_check(report: dict) -> str:
    """The report as one section a line, for a person."""
    devices = report["devices"]
    kinds = ", ".join(f"{d['kind']}:{d['index']} {d['name']} ({d['memory_mb']} MB)" for d in devices)
    memory, disk = report["memory"], report["disk"]
    rows = [
        ("devices", f"{len(devices)} worker(s): {kinds}"),
        ("memory", f"{_gb(memory['available_bytes'])} free of {_gb(memory['total_bytes'])}"),
        ("disk", f"{_gb(disk['free_bytes'])} free of {_gb(disk['total_bytes'])} for {disk['path']}"),
    ]
    peers = report["initial_peers"]
    answered = [p for p in peers if p["answered"]]
    said = "; ".join(f"…{p['peer_id'][-8:]} at {', '.join(p['at'])}" for p in answered)
    rows.append(
        ("initial peers", f"{len(answered)} of {len(peers)} answered" + (f": {said}" if said else ""))
    )
    task = report["task"]
    if task is not None:
        rows.append(
            (
                "task",
                f"{task['task_id']}: {task['task']}, {task['mode']}-parallel, aggregator {task['aggregator']}",
            )
        )
    else:
        rows.append(("task", "not found" if peers and answered else "not asked: no initial peer answered"))
    reach = report["reachability"]
    rows.append(("reachability", reach["summary"] if reach else "not checked"))
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)
