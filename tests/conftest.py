"""Test harness shared by the whole suite.

hivemind needs the fork start method and reads its torch sharing strategy at import, so
``prepare_process`` runs here, before any test module can import hivemind. Every test is followed by
a reaper: any process the test started and left running (a DHT process, an averager, a ``p2pd``
daemon, a worker) is stopped, and the test is reported as leaking, so a hang or an orphan never
survives into the next test or past the suite. And if this process's own multiprocessing listener
is gone after a test, the session stops there: every later call that passes a pipe to a DHT's
process would hang to its timeout (one CI run spent 75 minutes that way, test after test); so does a
hivemind result lock still held after a test (another CI run lost an hour to a dead holder).
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from multiprocessing import resource_sharer

import pytest

from hivemind_adapter.runtime import descendants, prepare_process, terminate_processes

prepare_process()
os.environ.setdefault("MANTA_LOG_LEVEL", "INFO")

# Phase 1 of `make test` runs one pytest-xdist worker per core; torch's default of one compute thread
# per core in each of them oversubscribes the machine (MANTA_TEST_TORCH_THREADS=0 keeps the default).
if os.environ.get("PYTEST_XDIST_WORKER") and os.environ.get("MANTA_TEST_TORCH_THREADS", "1") != "0":
    import torch

    torch.set_num_threads(int(os.environ.get("MANTA_TEST_TORCH_THREADS", "1")))


class LeakedProcessWarning(UserWarning):
    """A test left a child process running; the reaper stopped it."""


@pytest.fixture(autouse=True)
def keep_the_tree_s_result_lock_free(request: pytest.FixtureRequest):
    # Defined before the reaper, so checked after it has stopped what the test left running.
    yield
    mpfuture = sys.modules.get("hivemind.utils.mpfuture")
    if mpfuture is None:
        return
    # hivemind's lock on writing a result to this process: held for good, every later DHT call and
    # start waits on it (hivemind_adapter.process_locks; one CI run lost an hour so)
    lock = mpfuture.MPFuture._update_lock
    if not lock.acquire(timeout=10.0):
        pytest.exit(
            f"hivemind's result lock of this test process is still held 10 s after {request.node.nodeid}: "
            "every later DHT call and start would hang",
            returncode=3,
        )
    lock.release()


@pytest.fixture(autouse=True)
def restore_the_logging_environment():
    # A command run in this process with -v, -q or --log-format writes MANTA_LOG_LEVEL/FORMAT into
    # os.environ (for its children): the next test, and the processes it starts, must not inherit them.
    names = ("MANTA_LOG_LEVEL", "MANTA_LOG_FORMAT", "HIVEMIND_LOGLEVEL")
    saved = {name: os.environ.get(name) for name in names}
    root_level = logging.getLogger().level
    yield
    logging.getLogger().setLevel(root_level)
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(autouse=True)
def reap_child_processes(request: pytest.FixtureRequest):
    before = {p.pid for p in descendants()}
    yield
    leaked = [p for p in descendants() if p.pid not in before and not _python_helper(p)]
    stopped = terminate_processes(list(reversed(leaked)), timeout=5.0)
    if stopped:
        names = ", ".join(sorted({_describe(p) for p in stopped}))
        warnings.warn(
            f"{request.node.nodeid} left {len(stopped)} process(es) running: {names}",
            LeakedProcessWarning,
            stacklevel=1,
        )


@pytest.fixture(autouse=True)
def keep_this_process_s_listener(request: pytest.FixtureRequest):
    yield
    # multiprocessing's resource sharer: where a DHT's process fetches the pipes this process sends it
    address = resource_sharer._resource_sharer._address
    if isinstance(address, str) and not os.path.exists(address):
        pytest.exit(
            f"this test process's multiprocessing listener {address} was removed (found after "
            f"{request.node.nodeid}): every later call passing a pipe to a DHT would hang",
            returncode=3,
        )


@pytest.fixture(scope="session", autouse=True)
def reap_at_session_end():
    yield
    terminate_processes(list(reversed(descendants())), timeout=5.0)


def _python_helper(p) -> bool:
    """multiprocessing's resource tracker: started once by the first ``spawn`` of this process and
    meant to live as long as it does (the session-end reaper stops it), not a leak of one test."""
    try:
        return any("multiprocessing.resource_tracker" in part for part in p.cmdline())
    except Exception:
        return False


def _describe(p) -> str:
    try:
        return p.name()
    except Exception:  # the process vanished while we looked
        return str(p.pid)
