"""A process that goes away while it fetches a pipe from this one: one warning, no traceback, and the
resource sharer goes on handing out pipes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import logging, os, socket, sys, time
    import multiprocessing.resource_sharer as resource_sharer
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    if sys.argv[1] == "quiet":
        from hivemind_adapter.pipe_sharing import install_quiet_pipe_sharing
        install_quiet_pipe_sharing()
    read_end, write_end = os.pipe()
    first = resource_sharer.DupFd(read_end)  # starts this process's sharer thread
    # a receiver that connects and goes away in the middle of the handshake, as a killed process does
    lost = socket.socket(socket.AF_UNIX)
    lost.connect(first._id[0])  # the (address, key) it registered under
    lost.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\\x01\\x00\\x00\\x00\\x00\\x00\\x00\\x00")
    lost.close()  # linger 0: a reset, not an orderly close
    time.sleep(0.5)
    fd = first.detach()  # the sharer still serves: the pipe arrives
    os.write(write_end, b"x")
    print("served", os.read(fd, 1).decode(), flush=True)
    """
)


def _run(mode: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, timeout=60, cwd=os.getcwd()
    )


def test_a_receiver_lost_mid_fetch_is_one_warning_and_the_sharer_still_serves():
    done = _run("quiet")
    assert done.returncode == 0, done.stderr
    assert "served x" in done.stdout
    assert "Traceback" not in done.stderr, done.stderr
    assert "went away while it fetched a pipe from this one" in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_without_it_the_standard_library_prints_a_traceback():
    """The case the hook exists for: the same exchange without it prints the sharer's traceback."""
    done = _run("plain")
    assert done.returncode == 0, done.stderr
    assert "served x" in done.stdout
    assert "Traceback" in done.stderr and "resource_sharer.py" in done.stderr, done.stderr


def test_other_errors_still_reach_the_previous_hook():
    """An error raised anywhere else is reported as before, whatever its type."""
    from hivemind_adapter.pipe_sharing import install_quiet_pipe_sharing

    seen = []
    before = sys.excepthook
    sys.excepthook = lambda kind, value, tb: seen.append(kind)
    try:
        import hivemind_adapter.pipe_sharing as pipe_sharing

        installed = pipe_sharing._installed
        pipe_sharing._installed = False
        install_quiet_pipe_sharing()
        try:
            raise ConnectionResetError("from elsewhere")
        except ConnectionResetError:
            sys.excepthook(*sys.exc_info())
        assert seen == [ConnectionResetError]
    finally:
        sys.excepthook = before
        pipe_sharing._installed = installed
