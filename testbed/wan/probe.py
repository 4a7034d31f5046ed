"""Measurement endpoints run inside the emulated internet's namespaces (``ip netns exec NS python -m
testbed.wan.probe ...``); each prints one JSON object. Used by ``manta-swarm --check-links`` and the
testbed's tests.

- ``echo`` / ``rtt``: UDP round trips (median, spread), lost probes counted;
- ``blast`` / ``count``: a paced stream of numbered datagrams and the share that arrived (loss);
- ``send`` / ``recv``: a bulk TCP transfer; the receiver samples its bytes and its interface's
  counters, so the rate is read off the wire, not computed from payload sizes.
A side that ``--listen``s waits for the other; a UDP listener answers whoever reached it (through NAT).
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import struct
import sys
import time
from pathlib import Path

HEADER = struct.Struct("!Id")  # sequence number, send time


def _addr(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


def _ready() -> None:
    """Tell the orchestrator (on stderr) that this side is bound and can be reached."""
    sys.stderr.write("ready\n")
    sys.stderr.flush()


def _rx_bytes(device: str | None) -> int:
    if not device:
        return 0
    return int(Path(f"/sys/class/net/{device}/statistics/rx_bytes").read_text())


def echo(listen: str, seconds: float) -> dict:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(_addr(listen))
    sock.settimeout(0.2)
    _ready()
    answered, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            data, source = sock.recvfrom(2048)
        except TimeoutError:
            continue
        sock.sendto(data, source)
        answered += 1
    return {"answered": answered}


def rtt(connect: str, count: int, interval: float, wait: float) -> dict:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.connect(_addr(connect))
    sock.settimeout(0.001)
    sent: dict[int, float] = {}
    samples: list[float] = []
    next_send, seq = time.monotonic(), 0
    end = None
    while True:
        now = time.monotonic()
        if seq < count and now >= next_send:
            sock.send(HEADER.pack(seq, now) + b"\0" * 56)
            sent[seq] = now
            seq += 1
            next_send = now + interval
            if seq == count:
                end = now + wait
        if end is not None and now > end:
            break
        try:
            data = sock.recv(2048)
        except (TimeoutError, ConnectionRefusedError):
            continue
        number, stamp = HEADER.unpack_from(data)
        if sent.pop(number, None) is not None:
            samples.append((time.monotonic() - stamp) * 1000)
    if not samples:
        return {"sent": count, "received": 0}
    return {
        "sent": count,
        "received": len(samples),
        "median_ms": statistics.median(samples),
        "p10_ms": statistics.quantiles(samples, n=10)[0] if len(samples) > 10 else min(samples),
        "p90_ms": statistics.quantiles(samples, n=10)[-1] if len(samples) > 10 else max(samples),
    }


def _pace(sock: socket.socket, count: int, rate_bps: float, size: int, send) -> None:
    gap = size * 8 / rate_bps
    start = time.monotonic()
    payload = b"\0" * (size - HEADER.size)
    for seq in range(count):
        due = start + seq * gap
        delay = due - time.monotonic()
        if delay > 0.0005:
            time.sleep(delay)
        send(HEADER.pack(seq, time.monotonic()) + payload)


def blast(
    listen: str | None, connect: str | None, count: int, rate_bps: float, size: int, wait: float
) -> dict:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    if listen:  # wait for the counter's hello, then send to where it came from (through its NAT)
        sock.bind(_addr(listen))
        sock.settimeout(wait)
        _ready()
        try:
            _, target = sock.recvfrom(2048)
        except TimeoutError:
            return {"sent": 0, "error": "no hello"}
        _pace(sock, count, rate_bps, size, lambda b: sock.sendto(b, target))
    else:
        sock.connect(_addr(connect))
        _pace(sock, count, rate_bps, size, sock.send)
    return {"sent": count}


def count(listen: str | None, connect: str | None, expect: int, seconds: float) -> dict:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    # A burst must not overflow this socket and pass for link loss (FORCE: root may exceed rmem_max).
    sock.setsockopt(socket.SOL_SOCKET, getattr(socket, "SO_RCVBUFFORCE", 33), 16 * 2**20)
    sock.settimeout(0.2)
    if listen:
        sock.bind(_addr(listen))
        _ready()
    else:
        sock.connect(_addr(connect))
    seen: set[int] = set()
    end, last = time.monotonic() + seconds, None
    while time.monotonic() < end:
        if connect and not seen:
            sock.send(b"hello")  # opens the NAT mapping and tells the blaster where to send
        try:
            data = sock.recv(65536)
        except (TimeoutError, ConnectionRefusedError):
            if last is not None and time.monotonic() - last > 2.0:
                break  # the stream is over
            continue
        if len(data) >= HEADER.size:
            seen.add(HEADER.unpack_from(data)[0])
            last = time.monotonic()
    return {"expected": expect, "received": len(seen)}


def send(listen: str | None, connect: str | None, seconds: float) -> dict:
    if listen:
        server = socket.create_server(_addr(listen))
        server.settimeout(30)
        _ready()
        sock, _ = server.accept()
    else:
        sock = socket.create_connection(_addr(connect), timeout=30)
    buf, sent, end = b"\0" * 65536, 0, time.monotonic() + seconds
    while time.monotonic() < end:
        sock.sendall(buf)
        sent += len(buf)
    tcp = _tcp_info(sock)
    sock.shutdown(socket.SHUT_WR)
    sock.settimeout(30)
    while sock.recv(65536):
        pass
    sock.close()
    return {"sent_bytes": sent, **tcp}


def _tcp_info(sock: socket.socket) -> dict:
    """The sender's view of the flow (Linux ``struct tcp_info``): segments retransmitted, smoothed
    round trip and congestion window, which say why a flow fell short of the link."""
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
    rtt_us, cwnd = struct.unpack_from("<I", info, 68)[0], struct.unpack_from("<I", info, 80)[0]
    return {"retransmitted": struct.unpack_from("<I", info, 100)[0], "srtt_ms": rtt_us / 1000, "cwnd": cwnd}


def recv(listen: str | None, connect: str | None, device: str | None) -> dict:
    """Receive until the sender closes; samples (t, payload bytes, interface rx bytes) every 100 ms."""
    if listen:
        server = socket.create_server(_addr(listen))
        server.settimeout(30)
        _ready()
        sock, _ = server.accept()
    else:
        sock = socket.create_connection(_addr(connect), timeout=30)
    sock.settimeout(30)
    start, received = time.monotonic(), 0
    samples = [(0.0, 0, _rx_bytes(device))]
    while True:
        data = sock.recv(1 << 20)
        if not data:
            break
        received += len(data)
        now = time.monotonic()
        if now - start - samples[-1][0] >= 0.1:
            samples.append((now - start, received, _rx_bytes(device)))
    samples.append((time.monotonic() - start, received, _rx_bytes(device)))
    sock.close()
    return {"received_bytes": received, "samples": samples}


def connect_probe(connect: str, timeout: float) -> dict:
    try:
        with socket.create_connection(_addr(connect), timeout=timeout) as sock:
            return {"connected": True, "peer_saw": sock.recv(64).decode()}
    except OSError as e:
        return {"connected": False, "error": type(e).__name__}


def accept_probe(listen: str, seconds: float, count: int) -> dict:
    """Accept connections for ``seconds`` (or until ``count`` came); tell each client its address."""
    server = socket.create_server(_addr(listen))
    server.settimeout(0.2)
    _ready()
    seen, end = [], time.monotonic() + seconds
    while time.monotonic() < end and len(seen) < count:
        try:
            sock, source = server.accept()
        except TimeoutError:
            continue
        with sock:
            sock.sendall(source[0].encode())
        seen.append(source[0])
    return {"accepted_from": seen}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m testbed.wan.probe")
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("echo", "rtt", "blast", "count", "send", "recv", "connect", "accept"):
        s = sub.add_parser(name)
        s.add_argument("--listen")
        s.add_argument("--connect")
        s.add_argument("--seconds", type=float, default=10.0)
        s.add_argument("--count", type=int, default=100)
        s.add_argument("--interval", type=float, default=0.02)
        s.add_argument("--rate", type=float, default=1e6, help="bit/s")
        s.add_argument("--size", type=int, default=200)
        s.add_argument("--device")
    a = p.parse_args(argv)
    if a.cmd == "echo":
        out = echo(a.listen, a.seconds)
    elif a.cmd == "rtt":
        out = rtt(a.connect, a.count, a.interval, wait=2.0)
    elif a.cmd == "blast":
        out = blast(a.listen, a.connect, a.count, a.rate, a.size, wait=a.seconds)
    elif a.cmd == "count":
        out = count(a.listen, a.connect, a.count, a.seconds)
    elif a.cmd == "send":
        out = send(a.listen, a.connect, a.seconds)
    elif a.cmd == "recv":
        out = recv(a.listen, a.connect, a.device)
    elif a.cmd == "connect":
        out = connect_probe(a.connect, a.seconds)
    else:
        out = accept_probe(a.listen, a.seconds, a.count)
    json.dump(out, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
