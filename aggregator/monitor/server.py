"""Runs the dashboard's web application inside the aggregator process, on its own event loop thread.

The aggregator's main thread belongs to its publishing loop and hivemind runs its own processes, so
the web server gets a daemon thread with a private asyncio loop. :meth:`DashboardServer.start` binds
the port before returning (a taken port is a one-line :class:`DashboardError` at start-up, not a
thread dying later); :meth:`DashboardServer.stop` closes the listener and the loop.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import threading
from typing import Any

from aiohttp import web

from aggregator.monitor.app import build_app
from protocol.netaddr import AddressError, parse_host_port

logger = logging.getLogger(__name__)

DEFAULT_ADDRESS = "127.0.0.1:8080"


class DashboardError(ValueError):
    """The dashboard cannot listen where it was asked to (one line for the operator)."""


def parse_dashboard_option(value: str | None) -> tuple[str | None, bool]:
    """The ``--http`` option -> (HOST:PORT, or None for ``off``; whether a taken port may fall back).

    Not given: the default address, falling back to a free port if it is taken (a second aggregator
    on the same machine must not fail for a dashboard nobody asked for). Given: exactly that address.
    """
    if value is None:
        return DEFAULT_ADDRESS, True
    if value.strip().lower() == "off":
        return None, False
    try:
        parse_host_port(value, "--http")
    except AddressError as e:
        raise DashboardError(f"{e} (or 'off')") from None
    return value.strip(), False


def url_for(host: str, port: int) -> str:
    """The URL to print: a wildcard listener is reached through the loopback address."""
    shown = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
    return f"http://[{shown}]:{port}/" if ":" in shown else f"http://{shown}:{port}/"


class DashboardServer:
    def __init__(self, monitor: Any):
        self.monitor = monitor
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner = None
        self.url: str | None = None

    def start(self, address: str, *, fallback: bool = False) -> str:
        """Listen on ``address`` (HOST:PORT; port 0 picks a free one); returns the dashboard's URL."""
        try:
            host, port = parse_host_port(address, "--http")
        except AddressError as e:
            raise DashboardError(str(e)) from None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="manta-dashboard", daemon=True)
        self._thread.start()
        try:
            try:
                bound = self._call(self._listen(host, port))
            except OSError as e:
                if not (fallback and e.errno == errno.EADDRINUSE):
                    raise
                logger.warning(f"dashboard: {host}:{port} is taken, listening on a free port instead")
                bound = self._call(self._listen(host, 0))
        except BaseException as e:
            self.stop()
            if not isinstance(e, OSError):
                raise
            if e.errno == errno.EADDRINUSE:
                raise DashboardError(
                    f"--http {address}: the port is taken; choose another with --http HOST:PORT, or --http off"
                ) from None
            reason = e.strerror or str(e) or type(e).__name__
            raise DashboardError(f"--http {address}: cannot listen there ({reason})") from None
        self.url = url_for(host, bound)
        return self.url

    def _call(self, coroutine, timeout: float = 30.0):
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout)

    async def _listen(self, host: str, port: int) -> int:

        runner = web.AppRunner(build_app(self.monitor), access_log=None, handle_signals=False)
        await runner.setup()
        try:
            await web.TCPSite(runner, host, port).start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        return int(runner.addresses[0][1])

    def stop(self) -> None:
        if self._loop is None:
            return
        if self._runner is not None:
            try:
                self._call(self._runner.cleanup(), timeout=10.0)
            except Exception as e:  # the loop is going away anyway
                logger.debug(f"dashboard shutdown: {e}")
            self._runner = None
        try:
            self._call(self._loop.shutdown_default_executor(), timeout=10.0)
        except Exception as e:  # a view still running; the thread is a daemon
            logger.debug(f"dashboard shutdown: {e}")
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(10)
        self._loop.close()
        self._loop = self._thread = None
