"""Ctrl-C in the developer tools: a stop signal interrupts the run even where the shell left SIGINT
ignored, SIGTERM runs the cleanup too, and a signal during the cleanup waits for it to finish.

Each case is a real interpreter signalled by the real kernel (a child process, so that pytest's own
handlers are not involved)."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import os, signal, sys, time
    from testbed.interrupts import stop_signals_held, stop_signals_interrupt

    sig = getattr(signal, sys.argv[1])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # as a shell leaves a background job
    try:
        with stop_signals_interrupt():
            os.kill(os.getpid(), sig)
            time.sleep(5)
            print("ran on through the signal")
    except KeyboardInterrupt:
        print("interrupted")
    try:
        with stop_signals_held(say=lambda line: print("said:", line)):
            os.kill(os.getpid(), sig)
            time.sleep(0.2)
            print("cleanup finished")
    except KeyboardInterrupt:
        print("interrupted after the cleanup")
    print("SIGINT restored:", signal.getsignal(signal.SIGINT) is signal.SIG_IGN)
    """
)


@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM"])
def test_a_stop_signal_interrupts_and_waits_for_the_cleanup(signame):
    out = subprocess.run([sys.executable, "-c", SCRIPT, signame], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.splitlines() == [
        "interrupted",
        "said: still removing what this run started; it ends by itself within seconds",
        "cleanup finished",
        "interrupted after the cleanup",
        "SIGINT restored: True",
    ], out.stdout


def test_without_the_handlers_an_ignored_sigint_does_nothing_and_sigterm_skips_cleanup():
    """The cases the module exists for: checks that the script above can tell them apart."""
    probe = textwrap.dedent(
        """
        import os, signal, time
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.2)
        print("ran on through the signal", flush=True)
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        finally:
            print("cleanup ran")
        """
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert out.returncode == -signal.SIGTERM
    assert out.stdout.splitlines() == ["ran on through the signal"]
