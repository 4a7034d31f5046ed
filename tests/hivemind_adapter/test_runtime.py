"""prepare_process: torch's sharing strategy is chosen before hivemind's import, or the process stops.

hivemind sets torch's sharing strategy when it is imported; its default (``file_system``) starts a
``torch_shm_manager`` per process whose folder stays in /tmp when the process is killed. Each case
runs in a fresh interpreter, since the strategy is per process and this one is prepared already.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
STRATEGY = "import torch.multiprocessing as m; print(m.get_sharing_strategy())"


def _python(code: str) -> subprocess.CompletedProcess:
    # The variable this (prepared) test process set must not reach the child: it is what is tested.
    env = {k: v for k, v in os.environ.items() if k != "HIVEMIND_MEMORY_SHARING_STRATEGY"}
    path_code = f"import sys; sys.path.insert(0, {str(REPO)!r}); {code}"
    return subprocess.run(
        [sys.executable, "-c", path_code], capture_output=True, text=True, timeout=120, cwd=REPO, env=env
    )


def test_prepared_process_shares_tensors_by_file_descriptor() -> None:
    done = _python(
        f"from hivemind_adapter.runtime import prepare_process; prepare_process(); import hivemind; {STRATEGY}"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-1] == "file_descriptor"


def test_hivemind_imported_first_is_refused() -> None:
    done = _python("import hivemind; from hivemind_adapter.runtime import prepare_process; prepare_process()")
    assert done.returncode != 0
    assert "hivemind was imported before hivemind_adapter.runtime.prepare_process()" in done.stderr


def test_the_red_teams_dishonest_peer_is_prepared_like_manta_peer() -> None:
    # It imports hivemind's modules at its top; before this was fixed it ran on hivemind's default.
    done = _python(f"import tests.adversaries.dishonest_peer; {STRATEGY}")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-1] == "file_descriptor"
