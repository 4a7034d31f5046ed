"""The dashboard's routes (aiohttp): the page, its static files, the JSON API and ``/metrics``.

Read-only by construction: every route is registered for GET (aiohttp adds HEAD), so any other method
on a known path is 405 and an unknown path is 404, both as a JSON ``{"error": ..., "status": ...}``.
Views run in a worker thread (they take locks and read SQLite), never on the event loop itself.

Routes::

    /                          the dashboard page (static/index.html)
    /static/<file>             its script and style sheet (served from this package: no CDN)
    /api/status                task, round and phase, peers online, cohorts, throughput, validation,
                               checkpoint and ledger head
    /api/rounds[?since=N]      per-round aggregates (samples, loss, peers, throughput, validation)
    /api/peers                 the peers table
    /api/ledger                ledger head and reward table ({"present": false} before the first receipt)
    /api/ledger/proof/<index>  an entry and its inclusion proof under the latest signed checkpoint
    /metrics                   Prometheus text format
"""

from __future__ import annotations

import asyncio
import functools
from pathlib import Path
from typing import Any

from aiohttp import web

from aggregator.monitor.ledger_view import ProofNotFound
from aggregator.monitor.metrics import CONTENT_TYPE
from ledger.errors import LedgerError

STATIC = Path(__file__).with_name("static")

# The page may load only what this server serves: a CDN reference would fail offline, and this
# makes the browser refuse it, so a test catches it.
_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}

MONITOR = web.AppKey("monitor", Any)


def _error(status: int, message: str, headers: dict | None = None) -> web.Response:
    return web.json_response({"error": message, "status": status}, status=status, headers=headers)


@web.middleware
async def _json_errors(request: web.Request, handler):
    """Unknown paths and refused methods answer JSON too (and every answer gets the same headers)."""
    try:
        response = await handler(request)
    except web.HTTPMethodNotAllowed as e:
        allowed = ", ".join(sorted(e.allowed_methods))
        response = _error(405, f"{request.method} is not allowed here (read-only API)", {"Allow": allowed})
    except web.HTTPException as e:
        if e.status < 400:
            raise
        message = f"no such resource: {request.path}" if e.status == 404 else e.reason
        response = _error(e.status, message)
    response.headers.update(_HEADERS)
    if request.path.startswith(("/api/", "/metrics")):
        response.headers["Cache-Control"] = "no-store"
    return response


async def _call(request: web.Request, method: str, *args: Any) -> Any:
    view = getattr(request.app[MONITOR], method)
    return await asyncio.get_running_loop().run_in_executor(None, functools.partial(view, *args))


async def index(request: web.Request) -> web.FileResponse:
    return web.FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})


# The files under static/, by name: a request can name nothing else (no paths, no traversal).
_ASSETS = {p.name: p for p in STATIC.iterdir() if p.is_file()}


async def asset(request: web.Request) -> web.FileResponse:
    path = _ASSETS.get(request.match_info["name"])
    if path is None:
        raise web.HTTPNotFound()
    return web.FileResponse(path, headers={"Cache-Control": "no-cache"})


async def status(request: web.Request) -> web.Response:
    return web.json_response(await _call(request, "status"))


async def rounds(request: web.Request) -> web.Response:
    text = request.query.get("since", "0")
    if not text.isdigit():
        return _error(400, f"since must be a round number, got {text!r}")
    return web.json_response(await _call(request, "rounds", int(text)))


async def peers(request: web.Request) -> web.Response:
    return web.json_response(await _call(request, "peers"))


async def ledger(request: web.Request) -> web.Response:
    return web.json_response(await _call(request, "ledger"))


async def proof(request: web.Request) -> web.Response:
    index = int(request.match_info["index"])  # the route admits digits only
    try:
        return web.json_response(await _call(request, "proof", index))
    except ProofNotFound as e:
        return _error(404, str(e))
    except (LedgerError, OSError) as e:
        return _error(
            503, f"the ledger cannot be read: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
        )


async def metrics(request: web.Request) -> web.Response:
    text = await _call(request, "metrics")
    return web.Response(body=text.encode(), headers={"Content-Type": CONTENT_TYPE})


def build_app(monitor: Any) -> web.Application:
    """The web application over ``monitor`` (a :class:`~aggregator.monitor.service.Monitor`)."""
    app = web.Application(middlewares=[_json_errors])
    app[MONITOR] = monitor
    app.router.add_get("/", index)
    app.router.add_get("/api/status", status)
    app.router.add_get("/api/rounds", rounds)
    app.router.add_get("/api/peers", peers)
    app.router.add_get("/api/ledger", ledger)
    app.router.add_get(r"/api/ledger/proof/{index:\d{1,15}}", proof)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/static/{name}", asset)
    return app
