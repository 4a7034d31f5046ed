"""``<data-dir>/swarm.json``: the swarm a peer joined, so later commands find it without the join line.

``manta-peer join`` writes it once its node has started (the swarm answered): the initial peers it
was given, the task id it joined and the key that signed that task. ``manta-peer credits`` without
``--initial-peers`` (and ``check``) read it (:func:`swarm_to_reach`). Standard library only: read
before torch or hivemind is loaded.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

SWARM_FILE = "swarm.json"


@dataclass(frozen=True)
class SwarmRecord:
    """What ``swarm.json`` holds."""

    initial_peers: tuple[str, ...]
    task_id: str
    aggregator_key: str  # hex Ed25519 public key that signed the task


def write_swarm_record(data_dir: Path, record: SwarmRecord) -> Path:
    """Write ``data_dir/swarm.json`` atomically (a reader never sees half a file); returns its path."""
    path = Path(data_dir) / SWARM_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{SWARM_FILE}.{os.getpid()}.tmp")
    fields = {**asdict(record), "initial_peers": list(record.initial_peers)}
    tmp.write_text(json.dumps(fields, indent=2) + "\n")
    os.replace(tmp, path)
    return path


def read_swarm_record(data_dir: Path) -> SwarmRecord | None:
    """The record in ``data_dir``, or None if there is none; ValueError (one line) if it is unreadable."""
    path = Path(data_dir) / SWARM_FILE
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path} is unreadable ({' '.join(str(e).split())}): give --initial-peers") from None
    fields = ("initial_peers", "task_id", "aggregator_key")
    peers, task_id, key = (doc.get(k) if isinstance(doc, dict) else None for k in fields)
    if (
        not isinstance(peers, list)
        or not peers
        or not all(isinstance(p, str) for p in peers)
        or not isinstance(task_id, str)
        or not isinstance(key, str)
    ):
        raise ValueError(
            f"{path} is not a swarm record (initial_peers, task_id, aggregator_key): give --initial-peers"
        )
    return SwarmRecord(tuple(peers), task_id, key)


def swarm_to_reach(
    initial_peers: tuple[str, ...], task_id: str | None, aggregator_key: str | None, data_dir: Path
) -> tuple[tuple[str, ...], str | None, str | None]:
    """``(initial peers, task id, aggregator key)`` as given, or, without ``initial_peers``, as
    ``data_dir/swarm.json`` recorded them (a given task id or key wins), checked. Raises ValueError
    (one line) if neither names a swarm or a value is malformed."""
    from protocol.identity import check_public_key_hex
    from protocol.netaddr import check_peer_multiaddr

    if not initial_peers:
        record = read_swarm_record(data_dir)
        if record is None:
            raise ValueError(
                f"no --initial-peers and no {Path(data_dir) / SWARM_FILE} (manta-peer join writes it): "
                "give --initial-peers, or the --data-dir you joined with"
            )
        initial_peers, task_id = record.initial_peers, task_id or record.task_id
        if aggregator_key is None:
            aggregator_key = check_public_key_hex(
                record.aggregator_key, f"{Path(data_dir) / SWARM_FILE}: aggregator_key"
            )
    peers = tuple(check_peer_multiaddr(p) for p in initial_peers)
    if aggregator_key is not None:
        aggregator_key = check_public_key_hex(aggregator_key, "--aggregator-key")
    return peers, task_id, aggregator_key
