"""What an averager's all-reduces found, handed from the thread that runs them (its event loop's) to
its owner's: the senders its reducers named, the sampling noise they measured, the bytes they moved.
Each holder guards its own data with its own lock."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from robust_aggregation.reducer_proof import NoiseMap


class NameLog:
    """Names (peer ids, or tokens) collected in order, each once, and read or taken by another thread.
    At most ``limit`` are held: later ones are left out (a group's worth is far fewer)."""

    def __init__(self, limit: int = 256):
        self._limit = limit
        self._names: list[str] = []
        self._lock = threading.Lock()

    def write(self, names: Sequence[str]) -> None:
        """Hold ``names`` instead of what was held."""
        with self._lock:
            self._names = list(dict.fromkeys(names))[: self._limit]

    def add(self, names: Sequence[str]) -> None:
        """Add ``names`` to those held (each once, in the order first added)."""
        with self._lock:
            held = set(self._names)
            for name in names:
                if len(self._names) >= self._limit:
                    break
                if name not in held:
                    held.add(name)
                    self._names.append(name)

    def read(self) -> list[str]:
        with self._lock:
            return list(self._names)

    def take(self) -> list[str]:
        """The names held, which are then forgotten."""
        with self._lock:
            names, self._names = self._names, []
        return names


class NoiseSlot:
    """One :class:`~robust_aggregation.reducer_proof.NoiseMap` (or None), written by one thread and
    read or taken by another."""

    def __init__(self) -> None:
        self._noise: NoiseMap | None = None
        self._lock = threading.Lock()

    def write(self, noise: NoiseMap | None) -> None:
        with self._lock:
            self._noise = noise

    def read(self) -> NoiseMap | None:
        with self._lock:
            return self._noise

    def take(self) -> NoiseMap | None:
        """What is held, which is then forgotten."""
        with self._lock:
            noise, self._noise = self._noise, None
        return noise


class WireBytes:
    """Tensor payload bytes sent and received, counted by all-reduces and read by their owner."""

    def __init__(self) -> None:
        self._sent = self._received = 0
        self._lock = threading.Lock()

    def count(self, sent: int = 0, received: int = 0) -> None:
        with self._lock:
            self._sent += sent
            self._received += received

    def totals(self) -> tuple[int, int]:
        """``(sent, received)`` so far."""
        with self._lock:
            return self._sent, self._received
