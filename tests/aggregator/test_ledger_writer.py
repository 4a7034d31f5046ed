"""The ledger's single writer: every job runs on one thread (SQLite's own same-thread check would
raise otherwise), in order, and what is queued at close still runs before the store is closed."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from aggregator.ledger_writer import LedgerWriter, WriterClosed


def _open(path):
    def open_store() -> sqlite3.Connection:
        db = sqlite3.connect(path)  # check_same_thread: any other thread using it raises
        db.execute("CREATE TABLE IF NOT EXISTS t (n INTEGER)")
        return db

    return open_store


def test_jobs_from_many_threads_and_an_event_loop_all_run_on_the_writer(tmp_path):
    writer = LedgerWriter(_open(tmp_path / "w.sqlite"))
    threads = set()

    def insert(n):
        def job(db):
            threads.add(threading.current_thread().name)
            db.execute("INSERT INTO t VALUES (?)", (n,))
            db.commit()
            return n

        return writer.run(job, timeout=30)

    with ThreadPoolExecutor(8) as pool:
        assert sorted(pool.map(insert, range(200))) == list(range(200))

    async def from_a_handler():
        return await writer.arun(lambda db: db.execute("SELECT COUNT(*) FROM t").fetchone()[0])

    assert asyncio.run(from_a_handler()) == 200
    assert threads == {"manta-ledger"}
    # A job that calls back into the writer runs in place instead of waiting for itself.
    assert writer.run(lambda db: writer.run(lambda db2: db2 is db)) is True
    with pytest.raises(sqlite3.ProgrammingError):  # the store is the writer's alone
        writer.store.execute("SELECT 1")
    writer.close()


def test_close_runs_what_is_queued_then_refuses_more(tmp_path):
    path = tmp_path / "w.sqlite"
    writer = LedgerWriter(_open(path))
    gate = threading.Event()
    writer.submit(lambda db: gate.wait(10))
    futures = [
        writer.submit(lambda db, n=n: db.execute("INSERT INTO t VALUES (?)", (n,)) and db.commit())
        for n in range(5)
    ]
    gate.set()
    writer.close(timeout=30)
    assert all(f.done() and f.exception() is None for f in futures)
    assert sqlite3.connect(path).execute("SELECT COUNT(*) FROM t").fetchone()[0] == 5
    with pytest.raises(WriterClosed):
        writer.submit(lambda db: None)


def test_a_store_that_cannot_be_opened_fails_the_constructor(tmp_path):
    def broken():
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        LedgerWriter(broken)
