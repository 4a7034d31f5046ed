"""The first round of peers that start together waits for the roster to stop changing
(:func:`peer.catch_up.wait_for_settled_roster`): a peer that planned its first round on a partial
roster formed its own cohort and quorum, and its partner's round aborted."""

from __future__ import annotations

import threading
import time

from peer.catch_up import wait_for_settled_roster


class ArrivingRoster:
    """The roster as the DHT shows it: peer ``i`` appears ``arrivals[i]`` seconds after the start."""

    def __init__(self, arrivals: list[float]):
        self.start, self.arrivals = time.monotonic(), arrivals

    def __call__(self) -> frozenset[str]:
        elapsed = time.monotonic() - self.start
        return frozenset(f"peer-{i}" for i, at in enumerate(self.arrivals) if at <= elapsed)


def test_a_peer_announced_late_is_in_the_roster_the_first_round_reads():
    # The others announce 0.8 s and 1.6 s later: a fixed wait of ``settle`` after announcing misses one.
    roster = ArrivingRoster([0.0, 0.8, 1.6])
    t0 = time.monotonic()
    seen = wait_for_settled_roster(roster, threading.Event(), settle=1.0, limit=10.0)
    took = time.monotonic() - t0
    assert seen == {"peer-0", "peer-1", "peer-2"}
    assert 2.5 <= took < 4.5, took  # a second unchanged after the last arrival, not the limit


def test_a_roster_that_keeps_changing_is_read_at_the_limit():
    roster = ArrivingRoster([0.4 * i for i in range(100)])  # a newcomer every 0.4 s
    t0 = time.monotonic()
    seen = wait_for_settled_roster(roster, threading.Event(), settle=1.0, limit=3.0)
    assert 2.9 <= time.monotonic() - t0 < 4.5
    assert len(seen) >= 7


def test_a_stop_ends_the_wait_at_once():
    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()
    t0 = time.monotonic()
    wait_for_settled_roster(ArrivingRoster([0.0, 0.2]), stop, settle=5.0, limit=30.0)
    assert time.monotonic() - t0 < 1.5
