"""What an averager's all-reduces found, handed to its owner's thread."""

from __future__ import annotations

import threading

from hivemind_adapter.findings import NameLog, WireBytes


def test_a_name_log_holds_each_name_once_in_order_up_to_its_limit_and_is_taken_once():
    log = NameLog(limit=3)
    log.add(["b", "a", "b"])
    log.add(["a", "c", "d"])
    assert log.read() == ["b", "a", "c"]  # "d" past the limit is left out
    assert log.take() == ["b", "a", "c"] and log.take() == []
    log.write(["x", "x", "y"])
    assert log.read() == ["x", "y"]


def test_wire_bytes_counted_from_many_threads_add_up():
    counter = WireBytes()

    def count():
        for _ in range(10_000):
            counter.count(sent=3, received=1)

    threads = [threading.Thread(target=count) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert counter.totals() == (120_000, 40_000)
