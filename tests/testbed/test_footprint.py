"""A peer's footprint as manta-swarm reports it: its process tree and their proportional memory."""

from __future__ import annotations

import os
import subprocess
import sys

from testbed.footprint import FootprintSampler, footprint, footprint_line


def test_a_tree_is_counted_with_its_children_and_their_memory():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        alone = footprint(child.pid)
        assert alone is not None and alone.processes == 1
        mine = footprint(os.getpid())
        assert mine is not None and mine.processes >= 2 and mine.pss_mib > alone.pss_mib > 0
        sampler = FootprintSampler(every=0.0)
        sampler.tick({"peer-0": child.pid})
        sampler.tick({"peer-0": child.pid})
        assert sampler.summary()["peer-0"]["processes"] == 1
    finally:
        child.kill()
        child.wait()
    assert footprint(child.pid) is None


def test_the_summary_line_names_the_spread():
    line = footprint_line({"a": {"processes": 8, "pss_mib": 900.0}, "b": {"processes": 9, "pss_mib": 1100.0}})
    assert line == "per peer: 8–9 processes, memory (PSS) median 1000 MiB (largest 1100 MiB)"
    assert "not sampled" in footprint_line({})
