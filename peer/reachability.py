"""Whether the swarm can reach this peer, learned from a dial-back by a node of the swarm
(:mod:`hivemind_adapter.dial_back`), and what ``manta-peer join`` does about it: a peer that nobody
can connect to restarts its node in client mode and says so in one line, with what the user could
change (:func:`start_peer_dht`).

A peer counts as reachable when the node that dialled back found libp2p at one of the addresses this
peer announces; that node sees it from its own network, so two hosts of one LAN see each other.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hivemind_adapter.dht import start_dht, visible_maddrs
from hivemind_adapter.dial_back import CALL_SECONDS, DialBack, DialBackRefused, ask_dial_back
from hivemind_adapter.p2p import Endpoint
from protocol.netaddr import host_port_to_multiaddr, parse_host_port
from protocol.peer_keys import Libp2pKey

logger = logging.getLogger("manta.peer")

PROBE_SECONDS = 25.0  # every initial peer asked in turn, all within this


@dataclass(frozen=True)
class Reachability:
    """One dial-back's verdict: ``reachable``, ``unreachable``, or ``unknown`` (no node answered)."""

    verdict: str
    announced: tuple[str, ...]  # HOST:PORT this node announces
    found: DialBack | None = None
    why_unknown: str = ""

    def reachable_at(self) -> list[str]:
        """Announced addresses where the dial found libp2p."""
        found = self.found.reachable() if self.found else ()
        return [d.address for d in found if d.address in self.announced]

    def as_json(self) -> dict:
        found = self.found
        return {
            "verdict": self.verdict,
            "announced": list(self.announced),
            "asked": found.asked if found else None,
            "seen_from": list(found.seen_from) if found else [],
            "dialed": [{"address": d.address, "outcome": d.outcome} for d in found.dialed] if found else [],
            "why_unknown": self.why_unknown or None,
        }


def _host_port(maddr: str) -> str | None:
    parts = maddr.split("/")
    if len(parts) < 5 or parts[1] not in ("ip4", "ip6") or parts[3] != "tcp":
        return None
    return f"[{parts[2]}]:{parts[4]}" if parts[1] == "ip6" else f"{parts[2]}:{parts[4]}"


def initial_peer_ids(initial_peers: Sequence[str]) -> list[str]:
    """The peer ids of ``--initial-peers`` (``/.../p2p/ID``), each once, in their order."""
    return list(dict.fromkeys(m.rstrip("/").split("/")[-1] for m in initial_peers))


def probe(
    dht: Any, endpoint: Endpoint, initial_peers: Sequence[str], seconds: float = PROBE_SECONDS
) -> Reachability:
    """Ask the initial peers, in turn, to dial this node back until one answers (within ``seconds``)."""
    announced = tuple(dict.fromkeys(a for m in visible_maddrs(dht) if (a := _host_port(m))))
    ports = list(dict.fromkeys(int(a.rsplit(":", 1)[1]) for a in announced))
    if not ports:
        return Reachability("unknown", announced, why_unknown="this node announces no TCP address")
    deadline = time.monotonic() + seconds
    why = []
    for peer_id in initial_peer_ids(initial_peers):
        left = deadline - time.monotonic()
        if left <= 1.0:
            why.append("no time left")
            break
        try:
            found = ask_dial_back(endpoint, peer_id, ports, timeout=min(CALL_SECONDS, left))
        except DialBackRefused as e:
            why.append(f"…{peer_id[-8:]} refused: {e}")
            continue
        except Exception as e:  # an old node without the handler, a lost connection, a timeout
            why.append(f"…{peer_id[-8:]} does not dial back ({type(e).__name__})")
            continue
        verdict = Reachability("reachable", announced, found)
        return verdict if verdict.reachable_at() else Reachability("unreachable", announced, found)
    return Reachability("unknown", announced, why_unknown="; ".join(why) or "no initial peer")


def describe(reach: Reachability, listen: str) -> str:
    """One line for the user: what the dial-back found and, if unreachable, what the user could change."""
    found = reach.found
    if reach.verdict == "unknown" or found is None:
        return f"reachability unknown: {reach.why_unknown}"
    by = f"node …{found.asked[-8:]}"
    if reach.verdict == "reachable":
        return f"reachable: {by} connected to this peer at {', '.join(reach.reachable_at())}"
    seen = found.seen_from[0]
    client = "it runs in client mode (it connects out and trains, but serves only peers on its own LAN)"
    elsewhere = found.reachable()
    if elsewhere:  # a port that answers at the address it is seen from, which it does not announce
        at = elsewhere[0]
        return (
            f"{by} reached this peer at {at.address}, which it does not announce "
            f"({', '.join(reach.announced)}): {client}; to serve the swarm, pass "
            f"--listen 0.0.0.0:{at.port} --announce {at.address}"
        )
    tried = found.dialed[0] if found.dialed else None
    port = parse_host_port(listen)[1] or (tried.port if tried else 31338)
    outcome = f" ({tried.outcome})" if tried else ""
    public = f"[{seen}]" if ":" in seen else seen
    return (
        f"the swarm cannot connect to this peer: {by} sees it at {seen} and found no peer at "
        f"TCP port {tried.port if tried else '?'} there{outcome}; {client}. To serve the swarm, forward "
        f"TCP port {port} of your router to this machine and pass --listen 0.0.0.0:{port} --announce {public}:{port}"
    )


def start_peer_dht(
    initial_peers: Sequence[str],
    listen: str,
    announce: Sequence[str],
    client_mode: bool,
    libp2p_key: Libp2pKey,
) -> tuple[Any, bool]:
    """``join``'s DHT node and whether it runs in client mode. Unless ``client_mode`` or ``announce``
    is given, a node of the swarm dials it back: if none can connect, the node restarts in client
    mode (one INFO line saying why and what to change); if none answers, it stays as it is (debug).
    Raises hivemind_adapter.dht.SwarmUnreachable like :func:`start_dht`."""
    host = [host_port_to_multiaddr(listen, "--listen")]
    announce_maddrs = [host_port_to_multiaddr(a, "--announce", allow_port_zero=False) for a in announce]

    def start(client: bool) -> Any:
        return start_dht(
            initial_peers=initial_peers,
            host_maddrs=host,
            announce_maddrs=announce_maddrs or None,
            client_mode=client,
            libp2p_key=libp2p_key,
        )

    dht = start(client_mode)
    if client_mode or announce:
        return dht, client_mode
    try:
        endpoint = Endpoint(dht, "manta-reach")
        try:
            reach = probe(dht, endpoint, initial_peers)
        finally:
            endpoint.close()
    except BaseException:
        dht.shutdown()
        raise
    if reach.verdict != "unreachable":
        level = logging.INFO if reach.verdict == "reachable" else logging.DEBUG
        logger.log(level, describe(reach, listen) + ("" if level == logging.INFO else "; it stays a server"))
        return dht, False
    logger.info(describe(reach, listen))
    dht.shutdown()
    return start(True), True
