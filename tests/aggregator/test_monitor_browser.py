"""The dashboard in a real headless Chromium while a real local swarm trains.

Run it with ``make test-browser`` (installs Debian's ``chromium`` if missing). The screenshot and the
DOM the browser rendered are kept in ``test-artifacts/`` (or ``$MANTA_TEST_ARTIFACTS``).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from testbed.local_swarm import LocalSwarm, SwarmOptions
from tests.aggregator.monitor_helpers import free_port, get_json

pytestmark = pytest.mark.slow

ARTIFACTS = Path(
    os.environ.get("MANTA_TEST_ARTIFACTS", Path(__file__).resolve().parents[2] / "test-artifacts")
)
SMALL = dict(target_samples=96, batch_size=32, subnets=2, width_mult="0.25", head_channels=64)
LOSS_COLOR = (0xE4, 0x57, 0x2E)  # COLORS.loss in static/app.js


def _chromium() -> str:
    found = os.environ.get("MANTA_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if not found:
        pytest.skip("no chromium on this machine: run `make test-browser`, which installs it")
    return found


def _browse(tmp_path: Path, url: str, *args: str) -> subprocess.CompletedProcess:
    """One headless Chromium run over ``url``; the virtual time budget lets the page poll the API."""
    command = [
        _chromium(),
        "--headless",
        "--no-sandbox",  # tests run as root in CI containers
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--hide-scrollbars",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
        "--window-size=1400,1600",
        "--virtual-time-budget=6000",
        *args,
        url,
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def _pixels_like(png: Path, color: tuple[int, int, int], tolerance: int = 40) -> int:
    """How many pixels of the image are within ``tolerance`` (sum over R, G, B) of ``color``."""
    import numpy as np
    from PIL import Image

    with Image.open(png) as image:
        rgb = np.asarray(image.convert("RGB"), dtype=np.int32)
    return int((np.abs(rgb - np.array(color)).sum(axis=-1) <= tolerance).sum())


def test_the_dashboard_shows_live_peers_and_curves_in_chromium(tmp_path):
    _chromium()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    swarm = LocalSwarm(SwarmOptions(peers=2, rounds=12, run_dir=tmp_path / "run", **SMALL))
    try:
        swarm.start_aggregator(checkpoint_every=2.0, extra_args=("--http", f"127.0.0.1:{port}"))
        for i in range(2):
            swarm.start_peer(i)
        deadline = time.monotonic() + 240
        while True:
            status = get_json(f"{base}/api/status")
            losses = [r for r in get_json(f"{base}/api/rounds")["rounds"] if r["loss"] is not None]
            if status["peers_online"] == 2 and len(losses) >= 3:
                break
            assert swarm.peers_running(), "the peers left before the dashboard had data"
            assert time.monotonic() < deadline, f"no live data in time: {status}"
            time.sleep(1.0)
        peer_ids = {p["peer_id"] for p in get_json(f"{base}/api/peers")["peers"] if p["online"]}

        dom = _browse(tmp_path, f"{base}/", "--dump-dom").stdout
        (ARTIFACTS / "monitor-dashboard.html").write_text(dom)
        screenshot = ARTIFACTS / "monitor-dashboard.png"
        screenshot.unlink(missing_ok=True)
        _browse(tmp_path, f"{base}/", f"--screenshot={screenshot}")
        still_running = swarm.peers_running()
    finally:
        swarm.close()

    assert still_running, "the page was opened after the run ended: the data would not be live"
    # The page polled the API and filled the peers table with both live peers.
    assert 'class="badge live"' in dom, dom[:2000]
    rows = re.findall(r'<tr data-peer="([^"]+)" class="(online|offline)"', dom)
    assert {peer for peer, state in rows if state == "online"} == peer_ids and len(peer_ids) == 2, rows
    # The loss chart drew the rounds reported so far (charts.js records how many points it drew).
    points = int(re.search(r'<canvas id="chart-loss" class="chart" data-points="(\d+)"', dom).group(1))
    assert points >= 3, dom
    assert (
        int(re.search(r'<canvas id="chart-throughput" class="chart" data-points="(\d+)"', dom).group(1)) >= 3
    )
    # And the pixels agree: the loss line is on the screenshot (the legend swatch alone is 100 pixels).
    assert screenshot.stat().st_size > 10_000
    assert _pixels_like(screenshot, LOSS_COLOR) > 300
