"""asyncio's reports of hivemind tasks that end as expected stay out of the log; any other does not."""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Callable

from hivemind.p2p.p2p_daemon_bindings.control import ControlClient
from hivemind.proto import p2pd_pb2

from hivemind_adapter.task_reports import ExpectedTaskEndings


def _reports(make_task: Callable[[], None], quiet: bool) -> list[logging.LogRecord]:
    """Run ``make_task`` (it starts a task nobody awaits) on a fresh loop; what asyncio logs of it."""
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    async def main():
        make_task()
        await asyncio.sleep(0.1)

    log = logging.getLogger("asyncio")
    installed = [f for f in log.filters if isinstance(f, ExpectedTaskEndings)]  # by a DHT started before
    for f in installed:
        log.removeFilter(f)
    keep, expected = Keep(), ExpectedTaskEndings()
    gc.collect()  # what earlier tests left is reported now, outside the window that is read
    log.addHandler(keep)
    if quiet:
        log.addFilter(expected)
    try:
        asyncio.run(main())
        gc.collect()  # asyncio reports an unretrieved exception when the task is collected
    finally:
        log.removeFilter(expected)
        log.removeHandler(keep)
        for f in installed:
            log.addFilter(f)
    return records


def _wait_for_ending_in(error: BaseException) -> Callable[[], None]:
    async def fails():
        raise error

    def start() -> None:
        if isinstance(error, TimeoutError):
            asyncio.create_task(asyncio.wait_for(asyncio.Event().wait(), timeout=0.01))
        else:
            asyncio.create_task(asyncio.wait_for(fails(), timeout=10.0))

    return start


def _daemon_reader_ending_in(error: BaseException) -> Callable[[], None]:
    """hivemind's own reader of a p2p client's connection to its daemon, the connection failing."""

    def start() -> None:
        client = ControlClient(daemon_connector=None, _initialized_with_create=True)
        reader = asyncio.StreamReader()
        reader.set_exception(error)
        asyncio.create_task(client._read_from_persistent_conn(reader))

    return start


def test_an_unawaited_wait_for_timeout_is_not_logged_and_any_other_unretrieved_error_is():
    assert _reports(_wait_for_ending_in(TimeoutError()), quiet=True) == []
    errors = _reports(_wait_for_ending_in(ValueError("kept")), quiet=True)
    assert len(errors) == 1 and "Task exception was never retrieved" in errors[0].getMessage()
    assert isinstance(errors[0].exc_info[1], ValueError)


def test_a_daemon_connection_reset_is_not_logged_but_another_error_of_its_reader_is():
    reset = ConnectionResetError(104, "Connection reset by peer")
    unquiet = _reports(_daemon_reader_ending_in(reset), quiet=False)  # asyncio's report, with a traceback
    assert len(unquiet) == 1 and "_read_from_persistent_conn" in unquiet[0].getMessage()
    assert _reports(_daemon_reader_ending_in(reset), quiet=True) == []
    errors = _reports(_daemon_reader_ending_in(ValueError("a malformed reply")), quiet=True)
    assert len(errors) == 1 and isinstance(errors[0].exc_info[1], ValueError)


def _daemon_writer_ending_in(error: BaseException) -> Callable[[], None]:
    """hivemind's own writer of a p2p client's connection to its daemon, a message on its way as the
    connection fails (seen in CI: a peer's daemon killed while a DHT request was being sent)."""

    class Failing:
        async def drain(self):
            raise error

        def write(self, _data):
            pass

        def close(self):
            pass

    def start() -> None:
        client = ControlClient(daemon_connector=None, _initialized_with_create=True)
        client._pending_messages.put_nowait(p2pd_pb2.PersistentConnectionRequest(callId=b"0" * 16))
        asyncio.create_task(client._write_to_persistent_conn(Failing()))

    return start


def test_a_daemon_connection_lost_while_writing_is_not_logged_but_another_error_of_its_writer_is():
    lost = ConnectionResetError("Connection lost")
    unquiet = _reports(_daemon_writer_ending_in(lost), quiet=False)
    assert len(unquiet) == 1 and "_write_to_persistent_conn" in unquiet[0].getMessage()
    assert _reports(_daemon_writer_ending_in(lost), quiet=True) == []
    errors = _reports(_daemon_writer_ending_in(ValueError("not a connection error")), quiet=True)
    assert len(errors) == 1 and isinstance(errors[0].exc_info[1], ValueError)
