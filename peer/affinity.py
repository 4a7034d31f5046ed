"""Node affinity: who should average with whom first.

A cohort is the explicit ``--cohort`` name if given; otherwise peers on the same host form a cohort,
and peers alone on their host group by network (the /24 of the address they announce, or of the
address they reach the swarm from; behind NAT, that range together with the LAN's gateway). A cohort
larger than the task's maximum is split into near-equal parts by sorted peer id. Every peer computes
the assignment from the same DHT roster with no further messages, so all members agree on their
cohort (a peer seeing a slightly different roster only costs a round retry, never a wrong average:
see :mod:`peer.averaging.hierarchy`).
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import socket


def _machine_id() -> str:
    for path in ("/etc/machine-id", "/var/lib/dbus/machine-id"):
        try:
            with open(path) as f:
                raw = f.read().strip()
            if raw:
                return raw
        except OSError:
            continue
    return socket.gethostname()


def host_id() -> str:
    """A stable, anonymous id of this host as averaging sees it: its machine id and its network
    namespace. Processes in different network namespaces (containers, the testbed's emulated sites)
    cannot reach each other over loopback, so they are not one host, even on one machine."""
    try:
        netns = os.stat("/proc/self/ns/net").st_ino
    except OSError:
        netns = 0
    return hashlib.sha256(f"manta-host:{_machine_id()}:{netns}".encode()).hexdigest()[:16]


# Address ranges that NAT'd LANs reuse everywhere (RFC 1918, carrier-grade NAT, IPv6 ULA).
_NAT_RANGES = tuple(
    ipaddress.ip_network(n)
    for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "fc00::/7")
)


def is_nat_address(address: str) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip in net for net in _NAT_RANGES if net.version == ip.version)


def network_id(address: str | None, lan_gateway: str | None = None) -> str:
    """The hashed /24 (IPv4) or /48 (IPv6) of ``address``.

    A NAT'd LAN's range says little on its own (every home router hands out 192.168.1.0/24), so for
    such an address the network is the range *and* ``lan_gateway``, the MAC address of the default
    gateway, which hosts on one LAN share and two homes do not. Without it, or for an unknown
    address, the network is this host's alone: two strangers are never put in one cohort.
    """
    try:
        ip = ipaddress.ip_address(address or "")
        prefix = 24 if ip.version == 4 else 48
        net = str(ipaddress.ip_network(f"{ip}/{prefix}", strict=False))
    except ValueError:
        return hashlib.sha256(b"manta-net:unknown:" + host_id().encode()).hexdigest()[:8]
    if is_nat_address(str(ip)):
        lan = lan_gateway.lower() if lan_gateway else f"unknown:{host_id()}"
        return hashlib.sha256(f"manta-net:{net}:{lan}".encode()).hexdigest()[:8]
    return hashlib.sha256(b"manta-net:" + net.encode()).hexdigest()[:8]


def default_gateway_mac() -> str | None:
    """The MAC address of this host's IPv4 default gateway, from the kernel's route and ARP tables
    (known once traffic has left the host, e.g. after joining the DHT); None if not known."""
    try:
        with open("/proc/net/route") as f:
            rows = [line.split() for line in f.read().splitlines()[1:]]
        gateways = {int(r[2], 16) for r in rows if len(r) > 3 and r[1] == "00000000" and int(r[3], 16) & 2}
        with open("/proc/net/arp") as f:
            arp = [line.split() for line in f.read().splitlines()[1:]]
    except (OSError, ValueError):
        return None
    for gw in gateways:
        ip = socket.inet_ntoa(gw.to_bytes(4, "little"))
        for row in arp:
            if len(row) >= 4 and row[0] == ip and row[3] != "00:00:00:00:00:00":
                return row[3]
    return None


def cohort_on_lan(cohort: str, host: str, network: str, address: str) -> bool:
    """Whether every member of ``cohort`` reaches this peer without crossing a router: the automatic
    cohort of this host (``host``: its :func:`host_id`) or of its NAT'd LAN (``network``: its
    :func:`network_id`, range and gateway, for its ``address``), or a near-equal part of either. What
    lets a client-mode peer, which nobody outside its LAN can reach, still serve its cohort: its
    mates connect to its LAN address. An explicit ``--cohort`` or a public network may span routers."""
    base = cohort.split(".", 1)[0]
    return base == f"host-{host[:8]}" or (is_nat_address(address) and base == f"net-{network}")
