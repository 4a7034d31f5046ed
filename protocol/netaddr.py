"""HOST:PORT <-> libp2p multiaddr, for the `--listen`, `--announce` and `--initial-peers` options."""

from __future__ import annotations

import ipaddress


class AddressError(ValueError):
    """An address option that cannot be used; the message is one line for the user."""


def parse_host_port(text: str, option: str = "address") -> tuple[str, int]:
    """``"0.0.0.0:31337"``, ``"[::1]:31337"`` or ``"example.org:31337"`` -> (host, port)."""
    host, sep, port_text = text.strip().rpartition(":")
    if not sep or not host or not port_text.isdigit():
        raise AddressError(f"{option} must be HOST:PORT, got {text!r}")
    port = int(port_text)
    if not 0 <= port <= 65535:
        raise AddressError(f"{option} port must be 0..65535, got {port}")
    return host.strip("[]"), port


def host_port_to_multiaddr(text: str, option: str = "address", allow_port_zero: bool = True) -> str:
    host, port = parse_host_port(text, option)
    if port == 0 and not allow_port_zero:
        raise AddressError(f"{option} needs an explicit port (other peers must know where to connect)")
    try:
        ip = ipaddress.ip_address(host)
        proto = "ip4" if ip.version == 4 else "ip6"
    except ValueError:
        proto = "dns"
    return f"/{proto}/{host}/tcp/{port}"


def check_peer_multiaddr(text: str) -> str:
    """An initial peer must be a full multiaddr ending in /p2p/<peer id>."""
    parts = text.strip().split("/")
    if len(parts) < 7 or parts[0] != "" or parts[3] != "tcp" or parts[5] != "p2p" or not parts[6]:
        raise AddressError(f"initial peer must look like /ip4/HOST/tcp/PORT/p2p/PEER_ID, got {text!r}")
    return text.strip()
