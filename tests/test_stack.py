"""The third-party stack works together here, and MANTA's process conventions hold.

These are the foundation every later test stands on: torch and torchvision load together (the CUDA
wheel, run on the CPU), two hivemind DHT nodes find each other over 127.0.0.1, and nothing they start
outlives them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil

from hivemind_adapter.runtime import descendants


def test_torchvision_ops_load_with_this_torch():
    import torch
    import torchvision
    from torchvision.ops import box_iou

    boxes = torch.tensor([[0.0, 0.0, 2.0, 2.0], [1.0, 1.0, 3.0, 3.0]])
    iou = box_iou(boxes, boxes)
    assert torchvision.__version__.split("+")[0]
    assert torch.allclose(iou.diagonal(), torch.ones(2))
    assert abs(iou[0, 1].item() - 1.0 / 7.0) < 1e-6


def test_two_dht_nodes_bootstrap_store_get_and_leave_no_process():
    import hivemind
    from hivemind.utils import get_dht_time

    # Earlier tests may have left process-lifetime helpers (multiprocessing's resource tracker);
    # only what this test starts has to be gone after it.
    before = {p.pid for p in descendants()}

    def started_here():
        return [p for p in descendants() if p.pid not in before]

    first = hivemind.DHT(host_maddrs=["/ip4/127.0.0.1/tcp/0"], start=True)
    second = None
    try:
        maddrs = [str(m) for m in first.get_visible_maddrs()]
        assert maddrs and all(m.startswith("/ip4/127.0.0.1/tcp/") and "/p2p/" in m for m in maddrs)
        second = hivemind.DHT(initial_peers=maddrs, host_maddrs=["/ip4/127.0.0.1/tcp/0"], start=True)
        assert second.peer_id != first.peer_id

        assert second.store("manta-test-key", {"round": 7}, expiration_time=get_dht_time() + 30)
        found = first.get("manta-test-key", latest=True)
        assert found is not None and found.value == {"round": 7}

        p2pd = [p for p in started_here() if p.name() == "p2pd"]
        assert len(p2pd) == 2, "each DHT node runs its own p2pd daemon"
    finally:
        if second is not None:
            second.shutdown()
        first.shutdown()

    deadline = time.monotonic() + 10
    while started_here() and time.monotonic() < deadline:
        time.sleep(0.1)
    survivors = [f"{p.pid}:{p.name()}" for p in started_here()]
    assert survivors == [], f"processes outlived shutdown: {survivors}"
    assert not any(
        p.info["name"] == "p2pd" and p.info["ppid"] == os.getpid()
        for p in psutil.process_iter(["name", "ppid"])
    )


def test_parent_death_signal_stops_a_child_when_its_parent_is_killed(tmp_path):
    """A MANTA child process asks the kernel to stop it when its parent dies, even by SIGKILL."""
    pidfile = tmp_path / "grandchild.pid"
    parent_code = textwrap.dedent(f"""
        import os, subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", '''
        import os, time
        from hivemind_adapter.runtime import set_parent_death_signal
        assert set_parent_death_signal()
        open({str(pidfile)!r}, "w").write(str(os.getpid()))
        time.sleep(120)
        '''])
        time.sleep(120)
    """)
    parent = subprocess.Popen([sys.executable, "-c", parent_code])
    try:
        deadline = time.monotonic() + 30
        while not (pidfile.exists() and pidfile.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        grandchild = psutil.Process(int(pidfile.read_text()))
        assert grandchild.is_running()
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(timeout=10)
        grandchild.wait(timeout=10)  # raises TimeoutExpired if the child outlived its parent
        assert not grandchild.is_running()
    finally:
        if parent.poll() is None:
            parent.kill()


def test_orphan_reaper_stops_the_tree_of_a_killed_process(tmp_path):
    """SIGKILL of a process that started a grandchild leaves nothing running: the reaper cleans up."""
    pidfile = tmp_path / "grandchild.pid"
    code = textwrap.dedent(f"""
        import subprocess, sys, time
        from hivemind_adapter.runtime import start_orphan_reaper
        start_orphan_reaper()
        # A grandchild that, like p2pd, knows nothing about MANTA and would run on as an orphan.
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        open({str(pidfile)!r}, "w").write(str(child.pid))
        time.sleep(120)
    """)
    parent = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 30
        while not (pidfile.exists() and pidfile.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.6)  # at least one reaper snapshot after the grandchild started
        orphan = psutil.Process(int(pidfile.read_text()))
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(timeout=10)
        orphan.wait(timeout=10)
        assert not orphan.is_running()
    finally:
        if parent.poll() is None:
            parent.kill()
