"""A stalled step's report names where each of its tasks waits (through coroutines and async
generators), the worker threads running a job, and nothing for a step that ended in time."""

from __future__ import annotations

import asyncio
import threading

from hivemind_adapter.stall_report import (
    awaiting_chain,
    busy_worker_threads,
    generators_in_code,
    report_if_stalled,
    stall_report,
    tasks_in_code,
)


async def _innermost(gate: asyncio.Event) -> None:
    await gate.wait()


async def _parts(gate: asyncio.Event):
    yield 1
    await _innermost(gate)
    yield 2


async def _second_part(gate: asyncio.Event) -> int:
    parts = _parts(gate)
    async for value in parts:
        if value == 2:
            return value
    return -1


def test_a_tasks_chain_runs_from_its_coroutine_to_the_event_it_waits_on():
    async def main():
        gate = asyncio.Event()
        task = asyncio.create_task(_innermost(gate), name="waiter")
        await asyncio.sleep(0.01)
        chain = awaiting_chain(task)
        gate.set()
        await task
        return chain

    chain = asyncio.run(main())
    assert chain[0].startswith("_innermost (hivemind_adapter/test_stall_report.py:"), chain
    assert any(link.startswith("wait (asyncio/locks.py:") for link in chain), chain
    assert chain[-1] in ("<Future>", "<FutureIter>"), chain  # a future: Python's or asyncio's C one


def test_a_task_waiting_on_an_async_generator_is_linked_to_it_by_the_generators_chain():
    async def main():
        gate = asyncio.Event()
        task = asyncio.create_task(_second_part(gate), name="consumer")
        await asyncio.sleep(0.01)
        chain = awaiting_chain(task)
        generators = list(generators_in_code(("hivemind_adapter/test_stall_report",)))
        gate.set()
        return chain, generators, await task

    chain, generators, value = asyncio.run(main())
    assert value == 2
    assert chain[0].startswith("_second_part (") and chain[-1] == "<async_generator_asend>", chain
    assert len(generators) == 1, generators
    links = generators[0].removeprefix("generator ").split(" -> ")
    assert links[0].startswith("_parts (") and links[1].startswith("_innermost ("), links


def test_only_tasks_in_the_named_code_are_listed_and_a_report_has_one_line_each():
    async def main():
        gate = asyncio.Event()
        inside = asyncio.create_task(_innermost(gate), name="inside")
        outside = asyncio.create_task(asyncio.sleep(30), name="outside")
        await asyncio.sleep(0.01)
        loop = asyncio.get_running_loop()
        named = list(tasks_in_code(loop, ("hivemind_adapter/test_stall_report",)))
        none = list(tasks_in_code(loop, ("no/such/folder",)))
        report = stall_report("all-reduce in group abc", 40.0, loop)
        gate.set()
        outside.cancel()
        await inside
        return named, none, report

    named, none, report = asyncio.run(main())
    assert len(named) == 1 and named[0].startswith("task inside: _innermost ("), named
    assert none == []
    first, *rest = report.splitlines()
    assert first == "all-reduce in group abc still running after 40 s; where it waits:"
    assert any(line.startswith("  task inside: _innermost (") for line in rest), report
    assert not any("outside" in line for line in rest), report  # asyncio.sleep is not averaging code


def test_a_worker_thread_running_a_job_is_shown_and_an_idle_one_is_not():
    release = threading.Event()

    def blocked_job() -> None:
        release.wait(10)

    async def main():
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, lambda: None)  # one worker, idle again
        busy = loop.run_in_executor(None, blocked_job)
        await asyncio.sleep(0.05)
        lines = list(busy_worker_threads())
        release.set()
        await busy
        # the worker may still be handing the job's result over (the loop woke on its write): at
        # most a moment later it waits for its next job, and is not shown
        idle = list(busy_worker_threads())
        for _ in range(100):
            if not idle:
                break
            await asyncio.sleep(0.01)
            idle = list(busy_worker_threads())
        return lines, idle

    lines, idle = asyncio.run(main())
    assert len(lines) == 1, lines
    assert "blocked_job (hivemind_adapter/test_stall_report.py:" in lines[0], lines
    assert lines[0].split(" -> ")[-1].startswith("wait ("), lines  # innermost last
    assert idle == [], idle


def test_a_step_that_ends_in_time_is_not_reported_and_one_that_outlives_its_bound_is_once():
    async def step(seconds: float, after: float) -> list[str]:
        logged: list[str] = []
        watch = asyncio.create_task(report_if_stalled("all-reduce in group abc", after, logged.append))
        try:
            await asyncio.sleep(seconds)
        finally:
            watch.cancel()
        return logged

    assert asyncio.run(step(0.05, after=1.0)) == []
    logged = asyncio.run(step(0.3, after=0.05))
    assert len(logged) == 1, logged
    assert logged[0].startswith("all-reduce in group abc still running after 0 s; where it waits:"), logged
    assert "step (hivemind_adapter/test_stall_report.py:" in logged[0], logged


def test_a_report_ends_with_what_the_step_says_of_itself_even_when_that_fails():
    async def main() -> tuple[str, str]:
        loop = asyncio.get_running_loop()
        said = stall_report(
            "all-reduce in group abc", 40.0, loop, lambda: ["outputs from abcdefgh: 1 of 2 in"]
        )
        failed = stall_report("all-reduce in group abc", 40.0, loop, lambda: [][1])
        return said, failed

    said, failed = asyncio.run(main())
    assert said.splitlines()[-1] == "  outputs from abcdefgh: 1 of 2 in", said
    assert failed.splitlines()[-1].startswith("  (its progress could not be read: IndexError"), failed
