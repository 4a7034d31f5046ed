"""HOST:PORT <-> libp2p multiaddr, for the `--listen`, `--announce` and `--initial-peers` options."""

from __future__ import annotations

import ipaddress
import re


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


_BASE58 = set("123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz")
_HOST_LABEL = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")


def _valid_host(proto: str, value: str) -> bool:
    if proto in ("ip4", "ip6"):
        try:
            return ipaddress.ip_address(value).version == int(proto[-1])
        except ValueError:
            return False
    labels = value.rstrip(".").split(".")
    return 0 < len(value) <= 253 and all(_HOST_LABEL.match(label) for label in labels)


def _valid_peer_id(text: str) -> bool:
    # a base58 multihash: "Qm" + 44 (sha256 of an RSA key) or "12D3KooW" + 44 (an inline Ed25519 key)
    return 40 <= len(text) <= 128 and set(text) <= _BASE58 and text.startswith(("Qm", "12D3Koo", "16Uiu2"))


def check_peer_multiaddr(text: str) -> str:
    """An initial peer's full multiaddr, checked part by part: ``/ip4|ip6|dns|dns4|dns6/HOST``, then
    ``/tcp/PORT`` or ``/udp/PORT/quic-v1`` (or ``quic``), then ``/p2p/PEER_ID``. Raises AddressError
    (one line) naming what is wrong."""
    shape = "/ip4/HOST/tcp/PORT/p2p/PEER_ID (or /ip6, /dns4, /dns6, /dns; or /udp/PORT/quic-v1)"
    parts = text.strip().split("/")
    if len(parts) < 7 or parts[0] != "":
        raise AddressError(f"initial peer must look like {shape}, got {text!r}")
    proto, host, transport, port = parts[1], parts[2], parts[3], parts[4]
    rest = parts[5:]
    if proto not in ("ip4", "ip6", "dns", "dns4", "dns6") or not _valid_host(proto, host):
        raise AddressError(f"initial peer {text!r}: {proto} {host!r} is not a valid address")
    if transport not in ("tcp", "udp") or not port.isdigit() or not 0 < int(port) <= 65535:
        raise AddressError(
            f"initial peer {text!r}: needs /tcp/PORT or /udp/PORT/quic-v1 with a port 1..65535"
        )
    if transport == "udp":
        if not rest or rest[0] not in ("quic", "quic-v1"):
            raise AddressError(f"initial peer {text!r}: a /udp address needs /quic-v1 after its port")
        rest = rest[1:]
    if len(rest) != 2 or rest[0] != "p2p" or not _valid_peer_id(rest[1]):
        raise AddressError(f"initial peer {text!r} must end in /p2p/PEER_ID (a base58 libp2p peer id)")
    return text.strip()


def check_listen_options(listen: str, announce: tuple[str, ...]) -> None:
    """``--listen HOST:PORT`` and each ``--announce HOST:PORT`` (which needs a port): AddressError
    (one line) for the first malformed one."""
    host_port_to_multiaddr(listen, "--listen")
    for address in announce:
        host_port_to_multiaddr(address, "--announce", allow_port_zero=False)
