"""Where a stalled all-reduce waits: for a step that outlives what its members' own bounds allow, the
chain of awaits of each task on its event loop and of each busy async generator that runs averaging
code, and the busy worker threads' stacks, logged once as one record (an operator's and a developer's view of a stall that
ends only at the step's bound, with nothing logged meanwhile)."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import sys
import threading
from collections.abc import Callable, Iterator
from types import AsyncGeneratorType, CoroutineType, FrameType

logger = logging.getLogger(__name__)

# source files whose frames mark a task as part of an all-reduce (path fragments)
AVERAGING_CODE = ("hivemind/averaging/", "hivemind/p2p/", "hivemind_adapter/")
_MAX_DEPTH = 24  # links followed down one task's chain of awaits
_THREAD_FRAMES = 4  # innermost frames shown per busy worker thread


def _where(frame: FrameType) -> str:
    code = frame.f_code
    parts = code.co_filename.split(os.sep)
    return f"{code.co_name} ({'/'.join(parts[-2:])}:{frame.f_lineno})"


def awaiting_chain(task: asyncio.Task | AsyncGeneratorType) -> list[str]:
    """Each coroutine and async generator that ``task`` (or an async generator) is suspended in,
    outermost first, as "function (folder/file.py:line)", then what the innermost one awaits if that
    is not code: "<async_generator_asend>" where it awaits an async generator's next item (Python
    does not link the two; :func:`generators_in_code` lists the generators)."""
    links: list[str] = []
    awaited: object = task.get_coro() if isinstance(task, asyncio.Task) else task
    for _ in range(_MAX_DEPTH):
        if isinstance(awaited, CoroutineType):
            frame, awaited = awaited.cr_frame, awaited.cr_await
        elif hasattr(awaited, "ag_frame"):  # an async generator
            frame, awaited = awaited.ag_frame, awaited.ag_await
        elif hasattr(awaited, "gi_frame"):  # a generator-based awaitable
            frame, awaited = awaited.gi_frame, getattr(awaited, "gi_yieldfrom", None)
        else:
            if awaited is not None:
                links.append(f"<{type(awaited).__name__}>")
            break
        if frame is None:
            break
        links.append(_where(frame))
    return links


def tasks_in_code(
    loop: asyncio.AbstractEventLoop, fragments: tuple[str, ...] = AVERAGING_CODE
) -> Iterator[str]:
    """One line per pending task of ``loop`` (but the calling one) whose chain of awaits passes through a file whose path
    holds one of ``fragments``: its name and its chain, joined by " -> "."""
    reporter = asyncio.current_task(loop)  # the task asking, if on this loop: not a waiter
    for task in sorted(asyncio.all_tasks(loop) - {reporter}, key=lambda t: t.get_name()):
        chain = awaiting_chain(task)
        if any(fragment in link for link in chain for fragment in fragments):
            yield f"task {task.get_name()}: " + " -> ".join(chain)


def generators_in_code(fragments: tuple[str, ...] = AVERAGING_CODE) -> Iterator[str]:
    """One line per async generator in a file whose path holds one of ``fragments`` that is busy
    producing its next item: its chain of awaits (what the tasks' "<async_generator_asend>" await)."""
    for generator in gc.get_objects():
        if isinstance(generator, AsyncGeneratorType) and generator.ag_running and generator.ag_frame:
            chain = awaiting_chain(generator)
            if any(fragment in chain[0] for fragment in fragments):
                yield "generator " + " -> ".join(chain)


def busy_worker_threads(prefix: str = "asyncio_") -> Iterator[str]:
    """One line per thread named ``prefix``… (an event loop's default executor) that is running a
    job rather than waiting for one: its innermost frames, outermost first."""
    frames = sys._current_frames()
    for thread in threading.enumerate():
        frame = frames.get(thread.ident)
        if not thread.name.startswith(prefix) or frame is None:
            continue
        stack: list[FrameType] = []
        while frame is not None:
            stack.append(frame)
            frame = frame.f_back
        stack.reverse()
        innermost = stack[-1].f_code
        if innermost.co_name == "_worker" and innermost.co_filename.endswith("thread.py"):
            continue  # idle: the pool's worker waits for its next job (a C-level queue read)
        yield f"thread {thread.name}: " + " -> ".join(_where(f) for f in stack[-_THREAD_FRAMES:])


def stall_report(what: str, seconds: float, loop: asyncio.AbstractEventLoop) -> str:
    """The record :func:`report_if_stalled` logs: a first line, then one line per task and thread."""
    lines = [f"{what} still running after {seconds:.0f} s; where it waits:"]
    lines += [f"  {line}" for line in tasks_in_code(loop)] or ["  (no task in averaging code)"]
    lines += [f"  {line}" for line in generators_in_code()]
    lines += [f"  {line}" for line in busy_worker_threads()]
    return "\n".join(lines)


async def report_if_stalled(what: str, after: float, log: Callable[[str], None] = logger.warning) -> None:
    """Sleep ``after`` seconds, then log :func:`stall_report` once. Meant to run beside a step as a
    task that the step cancels when it ends, so that only a step outliving ``after`` is reported."""
    await asyncio.sleep(after)
    log(stall_report(what, after, asyncio.get_running_loop()))
