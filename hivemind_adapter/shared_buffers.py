"""Small fixed-size buffers that one process writes and another reads: an averager runs in a child
process of its owner, and what its reducer found (the senders it named, the sampling noise its
proofs measured) must reach the owner after each all-reduce. Each buffer is made before the writer
forks and guarded by its own lock, one that the writer's death releases (a semaphore, held by an
averager killed mid-write, would hang its owner's next read for ever: hivemind_adapter.process_locks)."""

from __future__ import annotations

import multiprocessing
from collections.abc import Sequence

from hivemind_adapter.process_locks import DeathSafeLock
from robust_aggregation.reducer_proof import NoiseMap


class SharedNames:
    """A short list of names (peer ids) written in one process and read in another: the averager's
    process says which senders its reducer named, its owner reads them. A fixed-size shared buffer,
    made before the writer forks; names that do not fit whole are left out (4 KiB hold ~75 ids, more
    than a group's worth)."""

    def __init__(self, size: int = 4096):
        self._buffer = multiprocessing.Array("c", size, lock=False)
        self._lock = DeathSafeLock()

    def write(self, names: Sequence[str]) -> None:
        with self._lock:
            self._write(names)

    def _write(self, names: Sequence[str]) -> None:
        text = b""
        for name in names:
            longer = text + b"\n" + name.encode() if text else name.encode()
            if len(longer) >= len(self._buffer):
                break
            text = longer
        self._buffer.value = text

    def read(self) -> list[str]:
        with self._lock:
            return self._read()

    def add(self, names: Sequence[str]) -> None:
        """Add ``names`` to those held (each once, in the order first added)."""
        with self._lock:
            held = self._read()
            self._write(held + [n for n in dict.fromkeys(names) if n not in held])

    def take(self) -> list[str]:
        """The names held, which are then forgotten."""
        with self._lock:
            names = self._read()
            self._buffer.value = b""
        return names

    def _read(self) -> list[str]:
        text = self._buffer.value.decode()
        return text.split("\n") if text else []


class SharedNoiseMap:
    """A :class:`~robust_aggregation.reducer_proof.NoiseMap` written in one process and read in another
    (an averager's and its owner's), in a fixed-size shared buffer made before the writer forks.
    Ranges past its capacity are left out: a part they would have covered is then not held to it."""

    def __init__(self, capacity: int = 2048):
        self._capacity = capacity
        self._buffer = multiprocessing.Array("d", 1 + 3 * capacity, lock=False)
        self._lock = DeathSafeLock()

    def write(self, noise: NoiseMap | None) -> None:
        ranges = [] if noise is None else list(noise.ranges)[: self._capacity]
        with self._lock:
            self._buffer[0] = len(ranges)
            for k, (start, end, level) in enumerate(ranges):
                self._buffer[1 + 3 * k : 4 + 3 * k] = [float(start), float(end), float(level)]

    def read(self) -> NoiseMap | None:
        with self._lock:
            return self._read()

    def take(self) -> NoiseMap | None:
        """What is held, which is then forgotten."""
        with self._lock:
            noise = self._read()
            self._buffer[0] = 0
        return noise

    def _read(self) -> NoiseMap | None:
        count = int(self._buffer[0])
        if count == 0:
            return None
        values = self._buffer[1 : 1 + 3 * count]
        return NoiseMap(
            tuple((int(values[3 * k]), int(values[3 * k + 1]), values[3 * k + 2]) for k in range(count))
        )
