"""Which peers a peer's matchmaking meets: the roster's, as it was read over the last minutes.

hivemind's matchmaking would meet anyone who knows a group key; MANTA's meets only peers the roster
pairs with their MANTA keys (:mod:`hivemind_adapter.group_keys`). A DHT read of the roster can come
back short (a node slow to answer, an announcement between refreshes): admitting only the latest read
would refuse an honest peer for an attempt and split its group. So a peer is admitted while it was in
any complete read (one holding this peer's own announcement) of the last :data:`ADMISSION_MEMORY`
seconds. A forged declaration or a Sybil that never announced itself is never in one.

A peer can also be barred for a while (:meth:`AdmissionMemory.bar`): a reducer whose replies this
peer refused as implausible would otherwise be met again at once, and refused again, attempt after
attempt. Barring is this peer's own view: a dishonest peer barring honest ones only isolates itself.
A key convicted by evidence anyone can check (:mod:`peer.guard.conviction_watch`) is barred for good
(:meth:`AdmissionMemory.bar_key`), under whatever peer id it announces.

Some refusals cannot tell the liar from an honest peer that carried the lie (a cohort head whose
cohort's result a liar bent): such a peer is barred briefly, and twice as long each time it is
refused again (:meth:`AdmissionMemory.bar_again`). A full bar there would split an honest swarm for
its whole term; a liar that keeps lying soon earns the full term anyway.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping

# An announcement is refreshed every few seconds and expires within a minute of its peer leaving:
# a peer absent from every read for this long has left.
ADMISSION_MEMORY = 300.0


class AdmissionMemory:
    """The peers (peer id -> public key hex) of the recent complete roster reads."""

    def __init__(self, memory: float = ADMISSION_MEMORY, clock: Callable[[], float] = time.monotonic):
        self.memory, self.clock = memory, clock
        # guards the four fields below: the round's thread updates them, the conviction watch's
        # thread reads the keys (peer.guard.conviction_watch)
        self._lock = threading.Lock()
        self._seen: dict[str, tuple[str, float]] = {}  # peer id -> (its key, when last read)
        self._last: dict[str, str] | None = None  # what update() last returned
        self._barred: dict[str, float] = {}  # peer id -> until when (clock time) it is not met
        self._barred_keys: set[str] = set()  # public keys (hex) never met again
        # peer id -> (how many bars bar_again placed in a row, when the last one ended)
        self._strikes: dict[str, tuple[int, float]] = {}

    def bar(self, peer_id: str, seconds: float) -> None:
        """Admit ``peer_id`` to no group for ``seconds`` (from the next :meth:`update` on)."""
        with self._lock:
            self._barred[peer_id] = max(self._barred.get(peer_id, 0.0), self.clock() + seconds)

    def bar_again(self, peer_id: str, first: float, most: float) -> float:
        """Bar ``peer_id`` for ``first`` seconds, doubled for each earlier bar of this kind in a row,
        at most ``most``; the seconds it is barred from now. A peer already barred keeps its bar and
        earns no new one (one refusal can reach the owner from several stages); one admitted
        for ``most`` seconds since its last such bar ended starts again from ``first``."""
        now = self.clock()
        with self._lock:
            until = self._barred.get(peer_id, 0.0)
            if until > now:
                return until - now
            count, ended = self._strikes.get(peer_id, (0, -math.inf))
            if now - ended > most:
                count = 0
            seconds = min(most, first * 2.0**count)
            self._strikes[peer_id] = (count + 1, now + seconds)
            self._barred[peer_id] = now + seconds
            return seconds

    def unbar(self, peer_id: str) -> None:
        """Admit ``peer_id`` again (from the next :meth:`update` on), unless its key is barred; its
        earlier bars no longer count toward :meth:`bar_again`'s."""
        with self._lock:
            self._barred.pop(peer_id, None)
            self._strikes.pop(peer_id, None)

    def bar_key(self, public_key_hex: str) -> None:
        """Admit no peer that announces ``public_key_hex``, from the next :meth:`update` on, for good."""
        with self._lock:
            self._barred_keys.add(public_key_hex)

    def barred(self) -> set[str]:
        now = self.clock()
        with self._lock:
            by_key = {p for p, (k, _) in self._seen.items() if k in self._barred_keys}
            return {p for p, until in self._barred.items() if until > now} | by_key

    def barred_for(self) -> dict[str, float]:
        """Each peer :meth:`barred` holds, with the seconds left of its bar (a barred key's: infinity)."""
        now = self.clock()
        with self._lock:
            left = {p: until - now for p, until in self._barred.items() if until > now}
            left.update({p: math.inf for p, (k, _) in self._seen.items() if k in self._barred_keys})
            return left

    def keys(self) -> dict[str, str]:
        """Every peer of the recent reads, barred ones included, with its key: whose signatures count."""
        with self._lock:
            return {p: k for p, (k, _) in self._seen.items()}

    def update(self, read: Mapping[str, str], own_peer_id: str) -> dict[str, str] | None:
        """Take one roster read; the peers to admit now if they changed since the last call, else
        None. A read without ``own_peer_id`` is incomplete and changes nothing."""
        now = self.clock()
        with self._lock:
            if own_peer_id in read:
                for peer, key in read.items():
                    self._seen[peer] = (key, now)
            self._seen = {p: (k, t) for p, (k, t) in self._seen.items() if now - t <= self.memory}
            self._barred = {p: until for p, until in self._barred.items() if until > now}
            admitted = {
                p: k
                for p, (k, _) in self._seen.items()
                if p not in self._barred and k not in self._barred_keys
            }
            if not admitted or admitted == self._last:
                return None
            self._last = admitted
            return admitted
