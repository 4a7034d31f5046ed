"""The wire of one emulated access link: a process that carries Ethernet frames between two TAP
devices, the site router's ``wan0`` and the core's ``s<k>``, after the link's one-way delay, with
jitter and random loss.

Why a process: this kernel has no ``netem`` qdisc, so delay and loss cannot come from ``tc``. Rate is
left to the kernel (a ``tbf`` on each TAP's egress shapes what enters the wire), so this loop only
holds frames for their delay and drops the configured share; that keeps it cheap enough for a few
hundred Mbit/s per link in Python (checked by ``manta-swarm --check-links``).

Invariants: frames of one direction leave in the order they came (jitter never reorders, unlike
netem's default: reordering would make TCP see loss that was not configured); loss is drawn from a
generator seeded per direction, so a run is repeatable; counters (frames and bytes carried and
dropped per direction) are written to ``--stats`` every second and at exit.

    python -m testbed.wan.relay --site NS:IF --core NS:IF --delay 40 --jitter 2 --loss 0.1 \\
        --seed 7 --stats counters.json
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import errno
import fcntl
import json
import math
import os
import random
import select
import signal
import struct
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from hivemind_adapter.runtime import set_parent_death_signal

TUNSETIFF = 0x400454CA
IFF_TAP, IFF_NO_PI = 0x0002, 0x1000
CLONE_NEWNET = 0x40000000
FRAMES_PER_WAKEUP = 256  # bound the work per readable fd so the other direction is not starved
# epoll waits in whole milliseconds, rounded up: wait the whole milliseconds that fit and send what is
# due within a quarter of one, so a frame leaves about on time instead of up to a millisecond late
# (benchmarks/RESULTS.md, "Emulated links").
EARLY_S = 0.00025


@dataclass
class DirectionCounters:
    frames: int = 0  # read from the sending side
    bytes: int = 0
    dropped_frames: int = 0  # lost on purpose (the configured loss)
    dropped_bytes: int = 0
    write_errors: int = 0  # the receiving TAP refused the frame
    # fidelity under load: how late frames held for their delay left, against their due time
    delayed_frames: int = 0
    late_ms_total: float = 0.0
    late_ms_max: float = 0.0
    late_over_5ms: int = 0


class Direction:
    """Frames in flight one way: FIFO with their due times."""

    def __init__(self, out_fd: int, delay_s: float, jitter_s: float, loss: float, rng: random.Random):
        self.out_fd, self.delay_s, self.jitter_s, self.loss, self.rng = out_fd, delay_s, jitter_s, loss, rng
        self.queue: collections.deque[tuple[float, bytes]] = collections.deque()
        self.last_due = 0.0
        self.counters = DirectionCounters()

    def take(self, frame: bytes, now: float) -> None:
        c = self.counters
        c.frames += 1
        c.bytes += len(frame)
        if self.loss and self.rng.random() < self.loss:
            c.dropped_frames += 1
            c.dropped_bytes += len(frame)
            return
        delay = self.delay_s + (self.rng.uniform(-self.jitter_s, self.jitter_s) if self.jitter_s else 0.0)
        due = max(now + max(0.0, delay), self.last_due)  # never overtake the frame before
        self.last_due = due
        if due <= now and not self.queue:
            self._write(frame)
        else:
            self.queue.append((due, frame))

    def deliver_due(self, now: float, early: float) -> None:
        """Send every frame due by ``now + early``; record how late each left (``now`` is the real time)."""
        queue, c = self.queue, self.counters
        while queue and queue[0][0] <= now + early:
            due, frame = queue.popleft()
            late = max(0.0, (now - due) * 1000)
            c.delayed_frames += 1
            c.late_ms_total += late
            c.late_ms_max = max(c.late_ms_max, late)
            c.late_over_5ms += late > 5.0
            self._write(frame)

    def next_due(self) -> float | None:
        return self.queue[0][0] if self.queue else None

    def _write(self, frame: bytes) -> None:
        try:
            os.write(self.out_fd, frame)
        except OSError as e:
            if e.errno not in (errno.EAGAIN, errno.EIO, errno.ENOBUFS, errno.EINVAL):
                raise
            self.counters.write_errors += 1  # the interface is down or its queue full: the frame is lost


def _setns(namespace: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/var/run/netns/{namespace}", os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({namespace}): {os.strerror(err)}")
    finally:
        os.close(fd)


def open_tap(namespace: str, name: str) -> int:
    """Attach to the TAP device ``name`` that exists in ``namespace`` (the fd keeps working after this
    process moves to another namespace)."""
    _setns(namespace)
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TAP | IFF_NO_PI))
    return fd


def _endpoint(text: str) -> tuple[str, str]:
    namespace, sep, device = text.partition(":")
    if not sep or not namespace or not device:
        raise argparse.ArgumentTypeError(f"expected NAMESPACE:DEVICE, got {text!r}")
    return namespace, device


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--site", type=_endpoint, required=True, help="NS:IF of the site router's TAP")
    parser.add_argument("--core", type=_endpoint, required=True, help="NS:IF of the core's TAP")
    parser.add_argument("--delay", type=float, default=0.0, help="one-way delay, ms")
    parser.add_argument("--jitter", type=float, default=0.0, help="uniform +- ms around the delay")
    parser.add_argument("--loss", type=float, default=0.0, help="percent of frames dropped, each way")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--stats", type=Path, required=True)
    args = parser.parse_args(argv)

    set_parent_death_signal()  # a killed testbed run takes its wires with it
    try:
        os.nice(-10)  # the wire must keep its timing while peers keep every core busy
    except OSError:
        pass
    site_fd = open_tap(*args.site)
    core_fd = open_tap(*args.core)
    delay, jitter, loss = args.delay / 1000, args.jitter / 1000, args.loss / 100
    up = Direction(core_fd, delay, jitter, loss, random.Random(args.seed * 2 + 1))
    down = Direction(site_fd, delay, jitter, loss, random.Random(args.seed * 2 + 2))
    by_fd = {site_fd: up, core_fd: down}

    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    signal.signal(signal.SIGINT, lambda *_: stopping.append(True))

    def write_stats() -> None:
        tmp = args.stats.with_suffix(".tmp")
        tmp.write_text(json.dumps({"up": asdict(up.counters), "down": asdict(down.counters)}))
        tmp.replace(args.stats)

    poller = select.epoll()
    for fd in by_fd:
        poller.register(fd, select.EPOLLIN)
    print("ready", flush=True)
    next_stats = time.monotonic() + 1.0
    while not stopping:
        now = time.monotonic()
        dues = [d for d in (up.next_due(), down.next_due()) if d is not None]
        timeout = min(math.floor(max(0.0, min(dues) - now - EARLY_S) * 1000) / 1000, 1.0) if dues else 1.0
        try:
            events = poller.poll(timeout)
        except InterruptedError:
            continue
        now = time.monotonic()
        for fd, _ in events:
            direction = by_fd[fd]
            for _ in range(FRAMES_PER_WAKEUP):
                try:
                    frame = os.read(fd, 65536)
                except BlockingIOError:
                    break
                except OSError as e:
                    if e.errno == errno.EBADFD:  # the device went away: the testbed is being torn down
                        stopping.append(True)
                    break
                direction.take(frame, now)
        now = time.monotonic()
        up.deliver_due(now, EARLY_S)
        down.deliver_due(now, EARLY_S)
        if now >= next_stats:
            write_stats()
            next_stats = now + 1.0
    write_stats()


if __name__ == "__main__":
    main()
