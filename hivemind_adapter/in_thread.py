"""hivemind's DHT and averagers served from a thread of the process that made them, not a fork of it.

hivemind makes each of them a ``multiprocessing.Process``: a fork of the peer that soon holds its own
copy of torch's and the peer's pages (150–170 MiB each, measured). :class:`ThreadHosted`, listed
before the hivemind class, keeps hivemind's caller-side API (a request is ``(method, args, kwargs)``,
answered through the MPFuture it carries) but serves it on an event loop in a thread of this process:
a request is scheduled on that loop, nothing is pickled, so futures and tensors pass as themselves.
It answers the ``Process`` questions MANTA's supervision asks (``is_alive``, ``exitcode``, ``join``,
``kill``) for that thread; ``kill`` ends the served side at once, shutting nothing down gracefully,
as a killed process would.

Each component gets its own loop (as each had its own process): a component that calls another's
blocking API from its loop (an averager reading the DHT) must not be waiting on itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from concurrent.futures import Future
from typing import Any

import uvloop

logger = logging.getLogger(__name__)

LEFTOVER_SECONDS = 5.0  # how long a component's ending waits for its cancelled tasks to end


def install_thread_safe_future_events() -> None:
    """Once per process: let an MPFuture be resolved from a thread running another event loop than
    the (idle) one it was made on (hivemind would run the creator's loop to set its event, which a
    thread already running a loop cannot do: the future's waiters were never woken); and let a step's
    caller attach the trigger its served side attached (one object here, not a copy)."""
    from hivemind.utils.mpfuture import MPFuture

    if getattr(MPFuture._set_event_threadsafe, "manta", False):
        return

    def set_event(self) -> None:
        loop = self._loop
        if loop.is_closed():
            return
        if not loop.is_running():
            self._aio_event.set()  # nobody waits on an idle loop; a later wait sees the flag
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            self._aio_event.set()
        else:
            loop.call_soon_threadsafe(self._aio_event.set)

    set_event.manta = True
    MPFuture._set_event_threadsafe = set_event

    from hivemind.averaging.control import StepControl

    attach = StepControl.attach

    def attach_once(self, trigger: MPFuture, cancel: MPFuture) -> None:
        # the caller attaches what the served side attached already: the same objects here, no copy
        if self._trigger is trigger and self._cancel is cancel:
            return
        attach(self, trigger, cancel)

    StepControl.attach = attach_once


class ComponentEnded(BrokenPipeError):
    """A request to a hosted component whose loop has closed (it was shut down, killed, or failed)."""


class _LoopRequests:
    """The caller's end of a hosted component's requests (what hivemind sends on ``_outer_pipe``)."""

    def __init__(self, host: ThreadHosted, loop: asyncio.AbstractEventLoop):
        self._host, self._loop = host, loop

    def send(self, request: tuple[str, list, dict]) -> None:
        method, args, kwargs = request
        try:
            self._loop.call_soon_threadsafe(self._host._dispatch, method, args, kwargs)
        except RuntimeError:  # the loop is closed
            raise ComponentEnded(f"{type(self._host).__name__} has ended") from None

    def close(self) -> None:
        """Nothing to close: the loop ends with the component."""


class ThreadHosted:
    """Mixin for a hivemind ``mp.Process`` component (listed before it): :meth:`start` serves it from
    a thread of this process. Subclasses say how its served side starts in :meth:`_serve`."""

    _host_thread: threading.Thread | None = None
    _host_exitcode: int | None = None
    _host_stopping = False  # a shutdown was asked for
    # How long a shutdown waits for the requests in flight (a store sent without waiting for it) to
    # end before it shuts the served side down; 0: it does not wait.
    drain_seconds: float = 0.0

    async def _serve(self) -> None:
        """Start the served side on the running loop (what hivemind's ``run`` does before its request
        loop); an exception fails the start and is what ``_ready`` raises."""
        raise NotImplementedError

    def _thread_name(self) -> str:
        return type(self).__name__

    # ------------------------------------------------------------------ the Process interface

    def start(self) -> None:
        if self._host_thread is not None:
            raise RuntimeError(f"{type(self).__name__} was already started")
        install_thread_safe_future_events()
        self._host_loop = uvloop.new_event_loop()  # as hivemind's own processes ran
        self._host_ready = asyncio.Event()  # bound to the host loop at its first use there
        self._host_stop = asyncio.Event()
        self._host_tasks: set[asyncio.Task] = set()  # cancelled when the loop ends
        self._host_requests: dict[asyncio.Task, list[Any]] = {}  # the requests in flight: their futures
        self._outer_pipe = _LoopRequests(self, self._host_loop)
        self._host_thread = threading.Thread(target=self._host_main, name=self._thread_name(), daemon=True)
        self._host_thread.start()

    def is_alive(self) -> bool:
        return self._host_thread is not None and self._host_thread.is_alive()

    @property
    def exitcode(self) -> int | None:
        """None while it runs (or before it started); 0 after a shutdown; 1 if it failed or was killed."""
        return self._host_exitcode

    @property
    def pid(self) -> None:
        """No process of its own (hivemind compares it with ``os.getpid()`` to tell its own process)."""
        return None

    def join(self, timeout: float | None = None) -> None:
        if self._host_thread is not None:
            self._host_thread.join(timeout)

    def kill(self) -> None:
        """End the served side now: pending requests are cancelled, nothing is shut down."""
        if self.is_alive():
            try:
                self._host_loop.call_soon_threadsafe(self._end_abruptly)
            except RuntimeError:  # closed meanwhile
                pass

    def _end_abruptly(self) -> None:
        """On the host loop: end as a killed process would (exit code 1)."""
        self._host_killed = True
        self._host_stop.set()

    def terminate(self) -> None:
        self.kill()

    # ------------------------------------------------------------------ the served side

    def _host_main(self) -> None:
        loop = self._host_loop
        asyncio.set_event_loop(loop)
        code = 1
        try:
            code = loop.run_until_complete(self._host_body())
        except BaseException:
            logger.exception("%s stopped on an error", self._thread_name())
        finally:
            try:
                leftover = [t for t in asyncio.all_tasks(loop) if not t.done()]
                self._refuse_pending_requests()
                for task in leftover:
                    task.cancel()
                if leftover:  # bounded: a task that ignores its cancellation must not keep the thread
                    _, stuck = loop.run_until_complete(asyncio.wait(leftover, timeout=LEFTOVER_SECONDS))
                    if stuck:
                        logger.warning(
                            "%s: %d task(s) did not end when cancelled", self._thread_name(), len(stuck)
                        )
                # hivemind's p2p objects finalise on the loop they were made on: let go of them while
                # it is still open here, not later in whichever thread collects them
                self._forget()
            finally:
                loop.close()
                self._host_exitcode = 1 if getattr(self, "_host_killed", False) else code

    async def _host_body(self) -> int:
        try:
            await self._serve()
        except Exception as e:
            logger.debug("%s did not start", self._thread_name(), exc_info=True)
            self._ready.set_exception(e.with_traceback(None))  # its frames hold loop-bound objects
            return 1
        self._host_ready.set()
        self._ready.set_result(None)
        try:
            await self._host_stop.wait()
        finally:
            await self._release()
        return 0

    def _forget(self) -> None:
        """Drop the references to objects bound to the host loop (it is about to close)."""

    async def _release(self) -> None:
        """After the served side ended, however: release what the process's exit would have."""

    async def _drain(self) -> None:
        """Let the other requests in flight end, for at most :attr:`drain_seconds`."""
        others = set(self._host_requests) - {asyncio.current_task()}
        if others and self.drain_seconds > 0:
            await asyncio.wait(others, timeout=self.drain_seconds)

    def _dispatch(self, method: str, args: list, kwargs: dict) -> None:
        """On the host loop: run the request once the served side has started."""
        task = asyncio.ensure_future(self._run_request(method, args, kwargs))
        self._host_tasks.add(task)
        task.add_done_callback(self._host_tasks.discard)
        self._host_requests[task] = [v for v in (*args, *kwargs.values()) if isinstance(v, Future)]
        task.add_done_callback(lambda done: self._host_requests.pop(done, None))

    def _refuse_pending_requests(self) -> None:
        """As the served side ends: the requests still in flight fail with :class:`ComponentEnded`
        (cancelled with the loop, their futures would raise asyncio's CancelledError in the caller)."""
        ended = ComponentEnded(f"{type(self).__name__} ended while a request was in flight")
        for futures in list(self._host_requests.values()):
            for future in futures:
                if not future.done():
                    with contextlib.suppress(Exception):
                        future.set_exception(ended)

    async def _run_request(self, method: str, args: list, kwargs: dict) -> Any:
        """One request; its answer goes through the future it carries. An error is logged in one line
        (at shutdown, with the daemon gone, not at all), never left to asyncio's traceback."""
        await self._host_ready.wait()
        if method == "_shutdown":
            self._host_stopping = True
            await self._drain()
        try:
            return await getattr(self, method)(*args, **kwargs)
        except Exception as e:
            log = logger.debug if method == "_shutdown" else logger.warning
            log("%s: %s failed: %s: %s", self._thread_name(), method, type(e).__name__, e)
            return None
        finally:
            if method == "_shutdown":
                self._host_stop.set()


async def _daemon_address(_dht: Any, node: Any) -> Any:  # runs on the DHT's loop (or in its process)
    return node.p2p.daemon_listen_maddr


class InThreadAverager(ThreadHosted):
    """Mixin for a ``DecentralizedAverager`` subclass (listed first): served from a thread, with a
    p2p client of its own on the DHT's daemon, as its process had."""

    def _thread_name(self) -> str:
        return f"manta-averager-{self.prefix}"

    async def _serve(self) -> None:
        from hivemind.averaging.matchmaking import Matchmaking
        from hivemind.p2p import P2P

        address = await self.dht.run_coroutine(_daemon_address, return_future=True)
        self._p2p = await P2P.replicate(address)
        try:
            if not self.client_mode:
                await self.add_p2p_handlers(self._p2p, namespace=self.prefix)
            self._matchmaking = Matchmaking(
                self._p2p, self.schema_hash, self.dht, client_mode=self.client_mode, **self.matchmaking_kwargs
            )
        except BaseException:
            await self._p2p.shutdown()
            raise
        if not self.client_mode:
            self._host_tasks.add(asyncio.create_task(self._declare_for_download_periodically()))
        self._state_updated = asyncio.Event()
        self._pending_groups_registered = asyncio.Event()
        self._pending_groups_registered.set()

    def _forget(self) -> None:
        for name in ("_p2p_client", "_manta_matchmaking"):
            self.__dict__.pop(name, None)
        self._running_groups = {}

    async def _release(self) -> None:
        p2p = self.__dict__.get("_p2p_client")  # hivemind_adapter.p2p_sockets.RemovesItsSocket's
        if p2p is not None and getattr(p2p, "_alive", True):
            try:
                await asyncio.wait_for(p2p.shutdown(), 5.0)
            except Exception:  # already closed with the daemon
                pass
