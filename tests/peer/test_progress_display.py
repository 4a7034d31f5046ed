"""The volunteer's progress display: redrawn status on a terminal, plain log lines elsewhere."""

from __future__ import annotations

import io
import os
import pty
import select
import subprocess
import time

import pytest

from peer.progress_display import ProgressDisplay
from peer.round_types import RoundReport
from testbed.local_swarm import LocalSwarm, SwarmOptions, console_script


def _report(committed=True) -> RoundReport:
    return RoundReport(
        round=4, committed=committed, samples=96, loss=1.25, cohort="host-ab", state_digest="f" * 64,
        seconds=3.0, contributors=2, reason="" if committed else "1 peer(s) of the roster did not contribute",
        times={"compute": 2.0, "averaging": 0.5, "waiting": 0.5},
    )  # fmt: skip


def test_a_terminal_gets_a_redrawn_status_line_and_one_line_per_round():
    out = io.StringIO()
    display = ProgressDisplay(out, interactive=True)
    display.computing(4, 64, 32.0, 150, 256)
    display.averaging(4)
    display.round_done(_report(), peers=3, credits=2.5e9)
    text = out.getvalue()
    assert "\r\x1b[2K" in text  # redrawn in place
    assert "round 5: computing  64 samples  32.0 samples/s  swarm [###########" in text
    assert (
        "round 5 committed: loss 1.2500, 96 samples at 48.0/s, cohort host-ab, 3 peer(s), credits 2.5e+09"
        in text
    )
    assert text.endswith("\n")


def test_a_pipe_or_file_gets_no_redrawing():
    out = io.StringIO()
    display = ProgressDisplay(out, interactive=False)
    display.computing(0, 10, 1.0, 10, 100)
    display.round_done(_report(False), peers=2, credits=0)
    display.close()
    assert out.getvalue() == ""  # the round's log line says it instead


@pytest.mark.swarm
@pytest.mark.slow  # a few minutes of swarm: `make test-all` runs it
def test_manta_peer_join_on_a_real_terminal_shows_live_progress(tmp_path):
    swarm = LocalSwarm(SwarmOptions(peers=1, rounds=2, run_dir=tmp_path, target_samples=64, subnets=2,
                                    width_mult="0.25", head_channels=64))  # fmt: skip
    master, slave = pty.openpty()
    try:
        swarm.start_aggregator(extra_args=("--http", "off"))
        peer = subprocess.Popen(
            [console_script("manta-peer"), "join", *swarm.join_args, "--gpus", "none", "--listen", "127.0.0.1:0",
             "--identity", str(tmp_path / "p.key"), "--data-dir", str(tmp_path / "p"), "--max-rounds", "2"],
            stdout=slave, stderr=subprocess.DEVNULL, env={**os.environ, "MANTA_WORKER_THREADS": "1"},
        )  # fmt: skip
        os.close(slave)
        chunks, deadline = [], time.monotonic() + 600
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1.0)
            if ready:
                try:
                    data = os.read(master, 65536)
                except OSError:  # the peer closed the terminal
                    break
                if not data:
                    break
                chunks.append(data)
            elif peer.poll() is not None:
                break
        assert peer.wait(timeout=60) == 0
    finally:
        os.close(master)
        swarm.close()
    text = b"".join(chunks).decode(errors="replace")
    assert "\r\x1b[2K" in text and "samples/s" in text, text[-2000:]
    assert "round 1 committed: loss" in text and "round 2 committed: loss" in text, text[-2000:]
