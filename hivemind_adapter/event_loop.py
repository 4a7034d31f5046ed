"""One asyncio event loop in a background thread, for synchronous code that calls async APIs.

hivemind's p2p handlers and calls are coroutines bound to the loop that created the P2P object; the
peer's round loop and the aggregator's threads are synchronous. Each of them owns one
:class:`BackgroundLoop` and runs every coroutine on it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable
from typing import Any


class BackgroundLoop:
    def __init__(self, name: str = "manta-asyncio"):
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def run(self, coro: Awaitable[Any], timeout: float | None = None) -> Any:
        """Run ``coro`` on the loop and wait for its result (TimeoutError after ``timeout`` s)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        """Cancel what still runs on the loop (e.g. a p2p client's connection readers), then stop it;
        tasks left pending would otherwise be reported as destroyed when the process exits."""
        if not self.loop.is_running():
            return

        async def cancel_others() -> None:
            others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in others:
                task.cancel()
            await asyncio.gather(*others, return_exceptions=True)

        try:
            self.run(cancel_others(), timeout=5)
        except Exception:
            pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)
