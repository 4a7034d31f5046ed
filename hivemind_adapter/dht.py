"""The DHT as MANTA uses it: start a node, store a value under a key and subkey, and read every
signed record under a key — each read bounded, each record opened (checked) by the caller's opener.

Every node registers MANTA's validator, so forged records are dropped where they are stored; a
reader still opens every entry itself (a node without the validator, or its own cache, may hand back
anything), and skips what its opener rejects. That loop used to be written out at nine call sites.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import hivemind
from hivemind.utils import get_dht_time

from protocol.records import RecordRejected

T = TypeVar("T")
READ_TIMEOUT = 10.0  # seconds for one DHT read: a dead bootstrap must cost this, never a hang


class SwarmUnreachable(RuntimeError):
    """The DHT node could not join the swarm; one line for the user."""


def start_dht(
    *,
    initial_peers: Sequence[str] = (),
    host_maddrs: Sequence[str] = ("/ip4/0.0.0.0/tcp/0",),  # hivemind's default
    announce_maddrs: Sequence[str] | None = None,
    client_mode: bool = False,
    identity_path: str | None = None,
    validators: Sequence[Any] = (),
) -> hivemind.DHT:
    """A running DHT node (its own process and p2pd daemon). SwarmUnreachable if it cannot join."""
    try:
        return hivemind.DHT(
            initial_peers=list(initial_peers),
            host_maddrs=list(host_maddrs),
            announce_maddrs=list(announce_maddrs) if announce_maddrs else None,
            client_mode=client_mode,
            identity_path=identity_path,
            check_if_identity_free=False if identity_path else True,
            record_validators=list(validators),
            start=True,
        )
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if "initial_peers responded" in first or "failed to connect to bootstrap peers" in first:
            first = f"cannot reach any initial peer ({', '.join(initial_peers)})"
        raise SwarmUnreachable(first) from None


def peer_id(dht: hivemind.DHT) -> str:
    return dht.peer_id.to_base58()


def visible_maddrs(dht: hivemind.DHT) -> list[str]:
    return [str(m) for m in dht.get_visible_maddrs()]


def dht_time() -> float:
    """The DHT's clock (expirations are in it)."""
    return get_dht_time()


def store(
    dht: hivemind.DHT,
    key: str,
    value: Any,
    ttl: float,
    subkey: str | None = None,
    timeout: float = READ_TIMEOUT,
    wait: bool = True,
) -> bool:
    """Store ``value`` for ``ttl`` seconds; False if no node took it within ``timeout``. ``wait=False``:
    return True at once while the DHT's process stores it."""
    future = dht.store(key, value, get_dht_time() + ttl, subkey=subkey, return_future=True)
    if not wait:
        return True
    try:
        return bool(future.result(timeout=timeout))
    except TimeoutError:
        return False


def read_entries(dht: hivemind.DHT, key: str, timeout: float = READ_TIMEOUT) -> dict[str, Any]:
    """subkey -> raw value of every entry under ``key``; {} if none, or none arrived within ``timeout``."""
    return read_entries_of_keys(dht, [key], timeout)[0]


def read_entries_of_keys(
    dht: hivemind.DHT, keys: Sequence[str], timeout: float = READ_TIMEOUT
) -> list[dict[str, Any]]:
    """:func:`read_entries` of each of ``keys``, the lookups in flight together (one ``timeout`` for
    all; a key whose lookup has not finished by then reads as {})."""
    futures = [dht.get(key, latest=True, return_future=True) for key in keys]
    deadline = time.monotonic() + timeout
    out = []
    for future in futures:
        try:
            found = future.result(timeout=max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            found = None
        if found is None or not isinstance(found.value, dict):
            out.append({})
        else:
            out.append({str(sub): item.value for sub, item in found.value.items()})
    return out


def read_signed(
    dht: hivemind.DHT, key: str, opener: Callable[[str, Any], T], timeout: float = READ_TIMEOUT
) -> list[T]:
    """``opener(subkey, value)`` of every entry under ``key``; entries it rejects are skipped."""
    out = []
    for sub, value in read_entries(dht, key, timeout).items():
        try:
            out.append(opener(sub, value))
        except RecordRejected:
            continue
    return out


async def _validator_counts(_dht: hivemind.DHT, node: Any) -> tuple[int, int]:
    """Runs in the DHT process, where hivemind validates what the node stores and receives."""
    checked = cached = 0
    for validator in getattr(node.protocol.record_validator, "_validators", ()):
        counts = getattr(validator, "counts", None)
        if isinstance(counts, tuple):
            checked, cached = checked + counts[0], cached + counts[1]
    return checked, cached


def record_validator_counts(dht: hivemind.DHT, timeout: float = READ_TIMEOUT) -> tuple[int, int]:
    """(entries checked, entries answered from a verdict cache) by the validators of ``dht``'s own
    process that count them (MANTA's): what validating the records it handled has cost so far."""
    return dht.run_coroutine(_validator_counts, return_future=True).result(timeout=timeout)
