"""A process that dies while it fetches a pipe from this one costs a log line, not a traceback.

hivemind's processes pass pipes to each other: a caller's reply pipe travels inside every request to
the DHT's or an averager's process. multiprocessing hands a pipe over through the sender's resource
sharer, a thread that accepts a connection from the receiving process, authenticates it, then sends
the descriptor. If the receiver is killed during that exchange, the thread's read fails
(``ConnectionResetError``, ``EOFError``). The thread goes on serving, and nothing is lost that was not
lost with the receiver, but it reports the error through ``sys.excepthook``: a full traceback in the
peer's log.

:func:`install_quiet_pipe_sharing` turns exactly those reports into one warning; every other error
reaches the previous hook unchanged.
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.resource_sharer
import sys
import traceback
from types import TracebackType

log = logging.getLogger(__name__)

_SHARER_FILE = multiprocessing.resource_sharer.__file__
# what a receiver that went away mid-exchange leaves the sharer's thread with
_RECEIVER_GONE = (ConnectionError, EOFError, multiprocessing.AuthenticationError)

_installed = False


def _raised_in_the_sharer(tb: TracebackType | None) -> bool:
    return any(frame.f_code.co_filename == _SHARER_FILE for frame, _ in traceback.walk_tb(tb))


def install_quiet_pipe_sharing() -> None:
    """Report a receiver lost by the resource sharer's thread in one line (once per process; a forked
    child keeps it)."""
    global _installed
    if _installed:
        return
    previous = sys.excepthook

    def hook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        if issubclass(kind, _RECEIVER_GONE) and _raised_in_the_sharer(tb):
            log.warning(
                f"a process went away while it fetched a pipe from this one ({kind.__name__}: {value})"
            )
            return
        previous(kind, value, tb)

    sys.excepthook = hook
    _installed = True
