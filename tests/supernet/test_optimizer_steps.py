"""MANTA's optimizer step is torch's, bit for bit, without importing torch._dynamo (150 MiB and about
2 s of CPU in every worker, for a compiler MANTA never runs)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_three_steps_match_torchs_own_and_leave_dynamo_unimported(optimizer):
    done = subprocess.run(
        [sys.executable, "-m", "tests.supernet.optimizer_steps", optimizer],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["ours"] == result["torchs"]
    assert result["dynamo_imported"] is False
