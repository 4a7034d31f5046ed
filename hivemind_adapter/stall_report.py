"""Where a stalled all-reduce waits: for a step that outlives what its members' own bounds allow, the
chain of awaits of each task on its event loop and of each busy async generator that runs averaging
code, the busy worker threads' stacks, and what the step itself says of its progress, logged once as
one record (an operator's and a developer's view of a stall that ends only at the step's bound, with
nothing logged meanwhile)."""

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

# source files whose frames mark a task or a generator as part of an all-reduce (path fragments)
AVERAGING_CODE = (
    f"hivemind{os.sep}averaging{os.sep}",
    f"hivemind{os.sep}p2p{os.sep}",
    f"hivemind_adapter{os.sep}",
)
GENERATOR_WAIT = "<async_generator_asend>"  # what a task awaiting an async generator's next item shows
_MAX_DEPTH = 24  # links followed down one chain of awaits
_THREAD_FRAMES = 4  # innermost frames shown per busy worker thread


def _where(frame: FrameType) -> str:
    code = frame.f_code
    parts = code.co_filename.split(os.sep)
    return f"{code.co_name} ({'/'.join(parts[-2:])}:{frame.f_lineno})"


def _chain(awaited: object) -> tuple[list[FrameType], str | None]:
    """The frames of each coroutine and async generator down ``awaited``'s chain of awaits, outermost
    first, and what the innermost one awaits if that is not code ("<type name>"; None: nothing)."""
    frames: list[FrameType] = []
    for _ in range(_MAX_DEPTH):
        if isinstance(awaited, CoroutineType):
            frame, awaited = awaited.cr_frame, awaited.cr_await
        elif isinstance(awaited, AsyncGeneratorType):
            frame, awaited = awaited.ag_frame, awaited.ag_await
        elif hasattr(awaited, "gi_frame"):  # a generator-based awaitable
            frame, awaited = awaited.gi_frame, getattr(awaited, "gi_yieldfrom", None)
        else:
            return frames, None if awaited is None else f"<{type(awaited).__name__}>"
        if frame is None:
            return frames, None
        frames.append(frame)
    return frames, None


def awaiting_chain(task: asyncio.Task | AsyncGeneratorType) -> list[str]:
    """Each coroutine and async generator that ``task`` (or an async generator) is suspended in,
    outermost first, as "function (folder/file.py:line)", then what the innermost one awaits if that
    is not code: :data:`GENERATOR_WAIT` where it awaits an async generator's next item (Python does
    not link the two; :func:`generators_in_code` lists the generators)."""
    frames, tail = _chain(task.get_coro() if isinstance(task, asyncio.Task) else task)
    return [_where(f) for f in frames] + ([tail] if tail else [])


def _in_code(frames: list[FrameType], fragments: tuple[str, ...]) -> bool:
    return any(fragment in f.f_code.co_filename for f in frames for fragment in fragments)


def tasks_in_code(
    loop: asyncio.AbstractEventLoop, fragments: tuple[str, ...] = AVERAGING_CODE
) -> Iterator[str]:
    """One line per pending task of ``loop`` (but the calling one) whose chain of awaits passes
    through a file whose path holds one of ``fragments``, or ends awaiting an async generator (which
    :func:`generators_in_code` follows): its name and its chain, joined by " -> "."""
    reporter = asyncio.current_task(loop)  # the task asking, if on this loop: not a waiter
    for task in sorted(asyncio.all_tasks(loop) - {reporter}, key=lambda t: t.get_name()):
        frames, tail = _chain(task.get_coro())
        if _in_code(frames, fragments) or tail == GENERATOR_WAIT:
            yield f"task {task.get_name()}: " + " -> ".join(
                [_where(f) for f in frames] + ([tail] if tail else [])
            )


def generators_in_code(fragments: tuple[str, ...] = AVERAGING_CODE) -> Iterator[str]:
    """One line per async generator defined in a file whose path holds one of ``fragments`` that is
    busy producing its next item: its chain of awaits (what tasks' :data:`GENERATOR_WAIT` await)."""
    for generator in gc.get_objects():
        if isinstance(generator, AsyncGeneratorType) and generator.ag_running and generator.ag_frame:
            frames, tail = _chain(generator)
            if frames and _in_code(frames[:1], fragments):
                yield "generator " + " -> ".join([_where(f) for f in frames] + ([tail] if tail else []))


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


def stall_report(
    what: str,
    seconds: float,
    loop: asyncio.AbstractEventLoop,
    progress: Callable[[], list[str]] | None = None,
) -> str:
    """The record :func:`report_if_stalled` logs: a first line, then one line per task, generator
    and thread, then ``progress()``'s lines (what the step says of itself)."""
    lines = [f"{what} still running after {seconds:.0f} s; where it waits:"]
    lines += [f"  {line}" for line in tasks_in_code(loop)] or ["  (no task in averaging code)"]
    lines += [f"  {line}" for line in generators_in_code()]
    lines += [f"  {line}" for line in busy_worker_threads()]
    if progress is not None:
        try:
            lines += [f"  {line}" for line in progress()]
        except Exception as e:  # a report must not fail the step it reports on
            lines.append(f"  (its progress could not be read: {type(e).__name__}: {e})")
    return "\n".join(lines)


async def report_if_stalled(
    what: str,
    after: float,
    log: Callable[[str], None] = logger.warning,
    progress: Callable[[], list[str]] | None = None,
) -> None:
    """Sleep ``after`` seconds, then log :func:`stall_report` once. Meant to run beside a step as a
    task that the step cancels when it ends, so that only a step outliving ``after`` is reported."""
    await asyncio.sleep(after)
    log(stall_report(what, after, asyncio.get_running_loop(), progress))
