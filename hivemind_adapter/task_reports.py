"""Keeps asyncio's reports of hivemind tasks whose ending is expected, and already said, out of the log.

asyncio logs a task nobody awaited that ended in an error ("Task exception was never retrieved")
with a full traceback when the task is collected. Two of hivemind's tasks end so in normal running:

- the re-declaration of an averager for state downloads, bounded by ``wait_for``, when the DHT does
  not answer in time: the next declaration is the retry, and nothing is lost;
- a p2p client's reader or writer of its connection to the p2pd daemon, when the daemon ends (the
  writer fails if a message was on its way): the DHT's watcher says so in one line (``the DHT's p2pd
  daemon ended``) and the peer stops with its own line.

:class:`ExpectedTaskEndings` drops exactly those records; any other error is logged.
"""

from __future__ import annotations

import asyncio
import logging

UNRETRIEVED = "Task exception was never retrieved"
_DAEMON_CONNECTION = (
    "coro=<ControlClient._read_from_persistent_conn()",
    "coro=<ControlClient._write_to_persistent_conn()",
)
_DAEMON_GONE = (ConnectionError, asyncio.IncompleteReadError)


class ExpectedTaskEndings(logging.Filter):
    """A filter for the ``asyncio`` logger: False for the two expected endings above."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if not message.startswith(UNRETRIEVED):
            return True
        error = record.exc_info[1] if record.exc_info else None
        timed_out = "coro=<wait_for()" in message and isinstance(error, (TimeoutError, asyncio.TimeoutError))
        daemon_gone = any(task in message for task in _DAEMON_CONNECTION) and isinstance(error, _DAEMON_GONE)
        return not (timed_out or daemon_gone)


_installed = False


def quiet_expected_task_endings() -> None:
    """Once per process: add :class:`ExpectedTaskEndings` to the ``asyncio`` logger."""
    global _installed
    if not _installed:
        logging.getLogger("asyncio").addFilter(ExpectedTaskEndings())
        _installed = True
