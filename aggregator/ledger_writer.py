"""The ledger's single writer: one thread that owns the aggregator's ledger and the desk's tables.

Receipts arrive on libp2p handlers, rounds close on a timer thread, audits revoke from a third. If
each of them took a lock around SQLite, every handler would wait behind the slowest of them and a
reader could see a half-finished round. Instead each hands its work to this
thread as a function and waits for the result (bounded): the work runs one job at a time, in arrival
order, on the only thread that touches the store. A job must not block on anything but the store (no
DHT calls, no network): whatever it needs from outside is fetched before it is handed over.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Generic, TypeVar

T = TypeVar("T")
S = TypeVar("S")

logger = logging.getLogger(__name__)


class WriterClosed(RuntimeError):
    """The writer has stopped; the job was not run."""


class LedgerWriter(Generic[S]):
    def __init__(self, open_store: Callable[[], S], name: str = "manta-ledger", open_timeout: float = 60.0):
        self._jobs: queue.Queue[tuple[Callable[[S], object], Future] | None] = queue.Queue()
        self._closed = threading.Event()
        opened: Future = Future()
        self._thread = threading.Thread(target=self._serve, args=(open_store, opened), name=name, daemon=True)
        self._thread.start()
        self.store: S = opened.result(timeout=open_timeout)  # raises what opening raised

    def _serve(self, open_store: Callable[[], S], opened: Future) -> None:
        try:
            store = open_store()
        except BaseException as e:
            opened.set_exception(e)
            return
        opened.set_result(store)
        while True:
            job = self._jobs.get()
            if job is None:
                break
            fn, future = job
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(store))
            except BaseException as e:
                future.set_exception(e)
        close = getattr(store, "close", None)
        if close is not None:
            close()

    def submit(self, fn: Callable[[S], T]) -> Future:
        """Queue ``fn(store)``; its Future."""
        if self._closed.is_set():
            raise WriterClosed("the ledger writer has stopped")
        future: Future = Future()
        self._jobs.put((fn, future))
        return future

    def run(self, fn: Callable[[S], T], timeout: float = 60.0) -> T:
        """``fn(store)`` on the writer thread; TimeoutError after ``timeout`` s."""
        if threading.current_thread() is self._thread:  # a job calling back in: run it in place
            return fn(self.store)
        return self.submit(fn).result(timeout=timeout)

    async def arun(self, fn: Callable[[S], T], timeout: float = 60.0) -> T:
        """:meth:`run` for a coroutine: awaits without blocking its event loop."""
        return await asyncio.wait_for(asyncio.wrap_future(self.submit(fn)), timeout)

    def close(self, timeout: float = 30.0) -> None:
        """Run what is queued, then close the store; bounded by ``timeout``."""
        if self._closed.is_set():
            return
        self._closed.set()
        self._jobs.put(None)
        self._thread.join(timeout=timeout)
        if self._thread.is_alive():
            logger.warning(f"the ledger writer did not finish its queue within {timeout:.0f} s")
