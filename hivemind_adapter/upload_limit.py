"""A cap on what a peer's whole process tree sends over libp2p: ``manta-peer join --max-upload``.

Every byte a MANTA node sends to another node leaves through its libp2p daemon, written there by one
of two hivemind functions: stream messages (all-reduce parts, broadcasts, state and shard pages
served as streams) by ``P2P.send_raw_data``, and unary calls and replies (DHT requests, MANTA's
endpoint calls) by the control client's ``write_pbmsg``. :func:`limit_upload` wraps both with one
token bucket that every process forked afterwards shares (an anonymous shared mapping and a lock the
kernel releases when its holder dies), so the tree's upload averages at most the given rate.
"""

from __future__ import annotations

import asyncio
import mmap
import struct
import time

from hivemind_adapter.process_locks import DeathSafeLock

BURST_SECONDS = 0.5  # the bucket holds this much of a second's allowance: short bursts pass unslowed
_FIELDS = struct.Struct("dd")  # tokens (bytes), last refill (time.monotonic)


class SharedTokenBucket:
    """``rate`` bytes per second, shared by this process and every process forked after it."""

    def __init__(self, rate: float, burst: float | None = None):
        if not rate > 0:
            raise ValueError(f"an upload rate must be positive, got {rate}")
        self.rate = float(rate)
        self.burst = float(burst if burst is not None else max(rate * BURST_SECONDS, 2**16))
        self._memory = mmap.mmap(-1, _FIELDS.size)  # anonymous and shared: forked children see it
        self._lock = DeathSafeLock()
        _FIELDS.pack_into(self._memory, 0, self.burst, time.monotonic())

    def take(self, nbytes: int) -> float:
        """Spend ``nbytes`` (going into debt if need be); the seconds to wait before sending them."""
        with self._lock:
            tokens, at = _FIELDS.unpack_from(self._memory, 0)
            now = time.monotonic()
            tokens = min(self.burst, tokens + (now - at) * self.rate) - nbytes
            _FIELDS.pack_into(self._memory, 0, tokens, now)
        return max(0.0, -tokens / self.rate)


_bucket: SharedTokenBucket | None = None


def limit_upload(rate: float) -> SharedTokenBucket:
    """Cap this process tree's libp2p upload at ``rate`` bytes per second. Call once, before the
    process forks its DHT, averagers and state sharer (they inherit the cap); a second call changes
    nothing and returns the bucket in force."""
    global _bucket
    if _bucket is not None:
        return _bucket
    from hivemind.p2p import p2p_daemon
    from hivemind.p2p.p2p_daemon_bindings import control

    bucket = SharedTokenBucket(rate)
    send_raw_data, write_pbmsg = p2p_daemon.P2P.send_raw_data, control.write_pbmsg

    async def paced_send_raw_data(data: bytes, writer: asyncio.StreamWriter, **kwargs) -> None:
        await asyncio.sleep(bucket.take(len(data) + 8))
        await send_raw_data(data, writer, **kwargs)

    async def paced_write_pbmsg(stream: asyncio.StreamWriter, pbmsg) -> None:
        await asyncio.sleep(bucket.take(pbmsg.ByteSize() + 4))
        await write_pbmsg(stream, pbmsg)

    p2p_daemon.P2P.send_raw_data = staticmethod(paced_send_raw_data)
    control.write_pbmsg = paced_write_pbmsg
    _bucket = bucket
    return bucket
